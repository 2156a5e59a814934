#!/usr/bin/env bash
# Regenerates docs/images/dashboard-job.png, the README's picture of the web dashboard:
# runs dashboard_cluster_test (a secure two-worker cluster training the example job,
# its page loaded in headless Chromium with a viewer token) and keeps its screenshot.
#   scripts/dashboard_screenshot.sh [BUILD_DIR]     (default: build)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$here/build}
cmake --build "$build" --target dashboard_cluster_test ddp-coordinator ddp-worker ddp-trainer ddpctl
DDP_DASHBOARD_SCREENSHOT="$here/docs/images/dashboard-job.png" "$build/bin/dashboard_cluster_test"
echo "wrote $here/docs/images/dashboard-job.png"
