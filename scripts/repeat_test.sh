#!/usr/bin/env bash
# Runs one test program N times in a row and counts how each run ended: a flake finder.
#   scripts/repeat_test.sh N PROGRAM [ARGS...]     e.g. 50 build-torch2/bin/libddp_cuda_test
# Each run gets DDP_REPEAT_TIMEOUT seconds (300); a run killed by a signal is a crash (its
# signal named), one past the limit a hang, a nonzero exit a failure. The last lines of
# every run that did not pass are kept under $DDP_REPEAT_LOGS (a temporary folder, named
# at the end). Exits 1 when any run did not pass.
set -uo pipefail
n=${1:?usage: repeat_test.sh N PROGRAM [ARGS...]}
shift
limit=${DDP_REPEAT_TIMEOUT:-300}
logs=${DDP_REPEAT_LOGS:-$(mktemp -d /tmp/ddp-repeat-XXXXXX)}
mkdir -p "$logs"
pass=0 fail=0 crash=0 hang=0
start=$(date +%s)
for ((i = 1; i <= n; i++)); do
  log="$logs/run$i.log"
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    pass=$((pass + 1)); rm -f "$log"; continue
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    hang=$((hang + 1)); what="hang (past ${limit} s)"
  elif [ "$rc" -gt 128 ]; then
    crash=$((crash + 1)); what="crash (signal $((rc - 128)): $(kill -l $((rc - 128)) 2>/dev/null))"
  else
    fail=$((fail + 1)); what="failed (exit $rc)"
  fi
  echo "run $i: $what; $(grep -m1 -E '^\[  FAILED  \]' "$log" || tail -n1 "$log")"
done
echo "$(basename "$1"): $n runs in $(( $(date +%s) - start )) s: $pass passed, $fail failed," \
  "$crash crashed, $hang hung (logs of those: $logs)"
[ $((fail + crash + hang)) -eq 0 ]
