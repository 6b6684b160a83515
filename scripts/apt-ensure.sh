#!/usr/bin/env bash
# Installs those of the given Debian packages that are not installed yet; quiet when all are.
#   scripts/apt-ensure.sh [--no-recommends] PACKAGE...
set -euo pipefail
options=()
if [ "${1:-}" = --no-recommends ]; then
    options+=(--no-install-recommends)
    shift
fi
missing=()
for p in "$@"; do
    # shellcheck disable=SC2016 # dpkg-query's format, not the shell's
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${options[@]}" "${missing[@]}"
fi
