#!/usr/bin/env bash
# The coordinator at cluster scale (docs/benchmarks.md): a real ddp-coordinator on
# this machine against ddp-loadgen's simulated agents over loopback, one TCP
# connection per agent, 1 Hz heartbeats. Each scenario runs RUNS times (default 3)
# on a fresh state directory; results land in bench/results/control_plane/ as one
# JSON file per run, and the medians are printed at the end.
#
#   bash bench/control_plane.sh                 # every scenario
#   bash bench/control_plane.sh idle job1024    # some of them
#   RUNS=1 AGENTS=2000 bash bench/control_plane.sh idle
#   AGENTS=10000 CONNECTIONS=1000 TAG=mux bash bench/control_plane.sh idle
#   COORDINATOR=/path/to/old/ddp-coordinator TAG=before bash bench/control_plane.sh idle
#
# Environment: BIN (build/bin: where ddp-loadgen, ddpctl and the coordinator are; another
# build's bin runs a previous commit side by side), RUNS (3), AGENTS for idle and
# unschedulable (10000), CONNECTIONS they
# share (0: one each), COORDINATOR (build/bin/ddp-coordinator), TAG (prefixes the
# result files), PORT (29811), INTERVAL (the coordinator's --heartbeat-interval, which
# the agents follow: 1s), TIMEOUT (its --heartbeat-timeout: 2.5s, the default),
# COORDINATOR_FLAGS (more ddp-coordinator flags, e.g. --max-heartbeats-per-second 5000:
# heartbeat rate scaling, decision 162: the agents are told a longer interval, which
# ddp-loadgen's follow and report as heartbeat_interval_s), WARMUP and DURATION (the
# idle and unschedulable scenarios' windows: 30s and 60s),
# LOADGEN_FLAGS (more ddp-loadgen flags for every scenario, e.g.
# --heartbeat-stream: heartbeats over one stream per agent, as ddp-worker sends them;
# --heartbeat-stream --quiet-beats 4: quiet heartbeats, one beat in 4 answered, as
# ddp-worker asks at a 1 s interval with TIMEOUT=10s, decision 161).
#
# Scenarios:
#   idle           AGENTS (10,000) agents, nothing to run; `ddpctl workers` timed meanwhile
#   unschedulable  the same with a job queued that no node can hold (2 ranks per node on
#                  1-slot agents)
#   job1024        a job on 1,024 nodes submitted first, agents join, fake trainers run
#                  10 s reporting a step per rank every second, exit 0
#   job2048        a job on 2,048 nodes, fake trainers for 20 s (a step every 5 s)
#   job4096        a job on 4,096 nodes, fake trainers for 20 s (a step every 5 s)
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BIN:-$here/build/bin}"
out="$here/bench/results/control_plane"
runs="${RUNS:-3}"
agents="${AGENTS:-10000}"
connections="${CONNECTIONS:-0}"
coordinator="${COORDINATOR:-$bin/ddp-coordinator}"
tag="${TAG:+${TAG}_}"
port="${PORT:-29811}"
mkdir -p "$out"
[[ -x "$bin/ddp-loadgen" ]] || { echo "build first: cmake --build build" >&2; exit 1; }

coordinator_pid=""
state=""
start_coordinator() {
  state="$(mktemp -d /tmp/ddp-bench-state.XXXXXX)"
  # 1 Hz heartbeats, as the issue measures (the default interval is 500 ms); the
  # default 2.5 s timeout, so two missed heartbeats in a row declare a worker lost.
  # shellcheck disable=SC2086  # COORDINATOR_FLAGS: words on purpose.
  "$coordinator" --listen "127.0.0.1:$port" --state-dir "$state" \
    --heartbeat-interval "${INTERVAL:-1s}" --heartbeat-timeout "${TIMEOUT:-2.5s}" \
    ${COORDINATOR_FLAGS:-} > "$state/coordinator.log" 2>&1 &
  coordinator_pid=$!
  for _ in $(seq 100); do
    "$bin/ddpctl" list --coordinator "127.0.0.1:$port" > /dev/null 2>&1 && return
    sleep 0.1
  done
  echo "the coordinator did not start: $(tail -3 "$state/coordinator.log")" >&2
  exit 1
}
stop_coordinator() {
  [[ -n "$coordinator_pid" ]] && kill "$coordinator_pid" 2> /dev/null && wait "$coordinator_pid" || true
  rm -rf "$state"
  coordinator_pid=""
}
trap stop_coordinator EXIT

# Times `ddpctl workers` (every page, table rendered) once `n` workers are alive.
time_ddpctl_workers() {
  local n="$1" file="$2" waited=0
  until "$bin/ddpctl" workers --summary --coordinator "127.0.0.1:$port" 2> /dev/null |
      tr -d , | grep -q "^$n workers: $n alive"; do
    sleep 1
    waited=$((waited + 1))
    [[ $waited -lt 300 ]] || { echo "not all $n workers came up" > "$file"; return 1; }
  done
  sleep 5
  : > "$file"
  for _ in 1 2 3 4 5 6 7 8 9 10 11; do
    local t0 t1
    t0=$(date +%s%N)
    "$bin/ddpctl" workers --coordinator "127.0.0.1:$port" > /dev/null
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000000 )) >> "$file"
  done
}

loadgen() {  # loadgen RESULT.json ARGS...
  local json="$1"
  shift
  # shellcheck disable=SC2086  # LOADGEN_FLAGS: words on purpose.
  "$bin/ddp-loadgen" --coordinator "127.0.0.1:$port" --coordinator-pid "$coordinator_pid" \
    --json "$json" ${LOADGEN_FLAGS:-} "$@" || echo "ddp-loadgen failed (exit $?)"
}

run_scenario() {
  local name="$1" run="$2"
  local json="$out/${tag}${name}_run${run}.json"
  echo "=== $tag$name, run $run ==="
  rm -f "$json"
  start_coordinator
  case "$name" in
    idle)
      local times="$out/${tag}ddpctl_workers_ms_run${run}.txt"
      time_ddpctl_workers "$agents" "$times" &
      local timer=$!
      loadgen "$json" --agents "$agents" --connections "$connections" --warmup "${WARMUP:-30s}" \
        --duration "${DURATION:-60s}"
      kill "$timer" 2> /dev/null || true  # Done long before, unless the workers never came up.
      wait "$timer" 2> /dev/null || true
      echo "ddpctl workers (ms, 11 runs): $(tr '\n' ' ' < "$times")"
      ;;
    unschedulable)
      # A job of 2 ranks per node on 1-slot agents: no node can hold it, so it heads
      # the queue as unschedulable (a job needing more nodes than there are agents is
      # refused at submit past 4,096 nodes).
      loadgen "$json" --agents "$agents" --connections "$connections" \
        --job-nodes 2 --job-slots 2 --warmup "${WARMUP:-30s}" --duration "${DURATION:-60s}" \
        --job-timeout 0s
      "$bin/ddpctl" list --coordinator "127.0.0.1:$port" | head -3
      ;;
    job1024)
      loadgen "$json" --agents 1024 --job-nodes 1024 --submit-first --fake-trainers \
        --train-time 10s --step-every 1s --warmup 3s --duration 15s --job-timeout 120s
      ;;
    job2048)
      loadgen "$json" --agents 2048 --job-nodes 2048 --submit-first --fake-trainers \
        --train-time 20s --step-every 5s --warmup 5s --duration 25s --job-timeout 300s
      ;;
    job4096)
      loadgen "$json" --agents 4096 --job-nodes 4096 --submit-first --fake-trainers \
        --train-time 20s --step-every 5s --warmup 5s --duration 25s --job-timeout 300s
      ;;
    *) echo "unknown scenario $name" >&2; exit 2 ;;
  esac
  stop_coordinator
}

scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=(idle unschedulable job1024 job4096)
echo "machine: $(nproc) cores, $(grep MemTotal /proc/meminfo | awk '{printf "%.0f GiB", $2/1048576}'),"\
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
for name in "${scenarios[@]}"; do
  for run in $(seq "$runs"); do run_scenario "$name" "$run"; done
done

python3 - "$out" "$tag" "${scenarios[@]}" <<'EOF'
import glob, json, os, statistics, sys
out, tag, names = sys.argv[1], sys.argv[2], sys.argv[3:]
keys = ["heartbeat_interval_s", "achieved_heartbeats_per_s", "target_heartbeats_per_s", "latency_ms_p50", "latency_ms_p99",
        "coordinator_cores", "coordinator_us_per_rpc", "coordinator_rss_kb_per_agent",
        "lost_in_window", "errors", "generator_cores"]
for name in names:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{tag}{name}_run*.json"))]
    if not runs:
        continue
    print(f"--- {tag}{name}: medians of {len(runs)} run(s)")
    for k in keys:
        vals = [r[k] for r in runs if k in r]
        if vals:
            print(f"  {k}: {statistics.median(vals):.3f}  ({', '.join(f'{v:.3f}' for v in vals)})")
    jobs = [r["job"] for r in runs if "job" in r]
    for k in ["last_join_to_all_hold_task_s", "last_pid_report_to_running_s"]:
        vals = [j[k] for j in jobs if k in j]
        if vals:
            print(f"  {k}: {statistics.median(vals):.3f}  ({', '.join(f'{v:.3f}' for v in vals)})")
    for j in jobs:
        print(f"  outcome: {j.get('outcome')}")
ms = []
for f in glob.glob(f"{out}/{tag}ddpctl_workers_ms_run*.txt"):
    ms += [int(x) for x in open(f).read().split() if x.isdigit()]
if ms:
    print(f"--- ddpctl workers: median {statistics.median(ms)} ms over {len(ms)} calls (max {max(ms)})")
EOF
