#!/usr/bin/env bash
# A pipeline's agent on a desktop of its own: make the desktop, give its agent the task, follow the answer,
# bring back what it produced, and destroy the desktop whatever happened.
#
# Needs the `lebureau` CLI (pip install ./sdk/python), LEBUREAU_URL and LEBUREAU_API_KEY (a key of a
# member of the workspace). TASK is the agent's task; the agent leaves what it produced in ~/out.
set -euo pipefail

name="${DESKTOP_NAME:-ci-${GITHUB_RUN_ID:-$(date +%s)}}"
task="${TASK:-Run the test suite of the project in ~/src and write a report to ~/out/report.md}"
out="${ARTEFACTS_DIR:-artefacts}"

lebureau desktops create "$name" --label ci --image "${IMAGE:-full}"
trap 'lebureau desktops rm "$name" --yes --no-wait' EXIT

# The answer as it comes; a non-zero exit when the agent ends in error fails the pipeline here.
lebureau chat "$name" "$task" --follow --timeout "${TASK_TIMEOUT:-3600}"

# What the agent produced, as a tarball through the desktop's shell (its output is capped at 1 MiB:
# keep artefacts small, or upload them from the desktop itself).
mkdir -p "$out"
lebureau exec "$name" --timeout 300 -- 'mkdir -p ~/out && tar -czf - -C ~/out . | base64 -w0' | base64 -d >"$out/artefacts.tgz"
tar -xzf "$out/artefacts.tgz" -C "$out"
echo "artefacts in $out:"
ls -l "$out"
