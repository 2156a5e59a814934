#!/usr/bin/env bash
# `cmake --install` lays out what a node needs: the four programs in bin/ and the
# reporting helper for users' Python programs in share/ddp/python, where ddp-worker
# looks for it beside its bin/ (and appends it to command jobs' PYTHONPATH).
#   install_test.sh BUILD_DIR PYTHON3
set -euo pipefail
build=$1
python3=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
for b in ddp-coordinator ddp-worker ddp-trainer ddpctl; do
  [ -x "$prefix/bin/$b" ] || { echo "FAIL: $prefix/bin/$b was not installed"; exit 1; }
done
helper="$prefix/share/ddp/python/ddp_report.py"
[ -f "$helper" ] || { echo "FAIL: $helper was not installed"; exit 1; }
# The installed helper imports and writes a step line to DDP_EVENTS_FD.
line=$(PYTHONPATH="$prefix/share/ddp/python" DDP_EVENTS_FD=3 "$python3" -c \
  'import ddp_report; ddp_report.step(loss=0.5, epoch=1)' 3>&1 >/dev/null)
case "$line" in
  *'"type": "step"'*'"loss": 0.5'*) ;;
  *) echo "FAIL: unexpected line from the installed ddp_report: $line"; exit 1 ;;
esac
"$prefix/bin/ddpctl" --version | grep -q ddpctl || { echo "FAIL: installed ddpctl does not run"; exit 1; }
echo "1 passed, 0 failed"
