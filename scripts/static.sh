#!/usr/bin/env bash
# Installs the pinned browser libraries (package-lock.json) and copies what the pages load into static.
set -euo pipefail
cd "$(dirname "$0")/.."
npm ci --no-audit --no-fund --loglevel=error
vendor=missioncontrol/static/vendor
rm -rf "$vendor" && mkdir -p "$vendor/novnc" "$vendor/xterm"
cp -r node_modules/@novnc/novnc/core node_modules/@novnc/novnc/vendor "$vendor/novnc/"
cp node_modules/@xterm/xterm/lib/xterm.mjs node_modules/@xterm/xterm/css/xterm.css \
    node_modules/@xterm/addon-fit/lib/addon-fit.mjs "$vendor/xterm/"
