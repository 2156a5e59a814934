#!/usr/bin/env bash
# The README's main-job command: builds ddp, starts a local ddp-coordinator and two
# ddp-worker agents on CPU, submits examples/cancer.yaml (the breast-cancer MLP on
# 2 nodes) and watches it train live with `ddpctl watch`.
#
#   bash scripts/demo.sh           # stops the local cluster when the job ends
#   bash scripts/demo.sh --keep    # leaves it running so you can try ddpctl
#   bash scripts/demo.sh --secure  # the same over mutual TLS with tokens: certificates
#                                  # and tokens from scripts/make_certs.sh in .demo/certs
#
# Logs and state go to .demo/ in the repository.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
keep=0 secure=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --secure) secure=1 ;;
    *) echo "usage: bash scripts/demo.sh [--keep] [--secure]" >&2; exit 2 ;;
  esac
done

bash scripts/install_deps.sh
# shellcheck disable=SC2046
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(bash scripts/cmake_compiler.sh build) >/dev/null
cmake --build build -j "$(nproc)" --target ddp-coordinator ddp-worker ddp-trainer ddpctl

bin="$here/build/bin"
demo="$here/.demo"
mkdir -p "$demo/logs"

# The coordinator's usual port, or the next free one.
port=${DDP_DEMO_PORT:-29400}
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
export DDP_COORDINATOR="127.0.0.1:$port"

coordinator_tls=() worker_tls=()
if [ "$secure" -eq 1 ]; then
  # A CA, the coordinator's certificate, one per worker, and tokens; ddpctl finds the
  # CA and the `user` token in the environment.
  [ -s "$demo/certs/tokens" ] || bash scripts/make_certs.sh "$demo/certs" >/dev/null
  coordinator_tls=(--tls-cert "$demo/certs/coordinator.pem" --tls-key "$demo/certs/coordinator.key"
                   --tls-ca "$demo/certs/ca.pem" --auth-token-file "$demo/certs/tokens")
  export DDP_TLS_CA="$demo/certs/ca.pem"
  DDP_TOKEN=$(cat "$demo/certs/user.token")
  export DDP_TOKEN
fi

pids=()
cleanup() {
  if [ "$keep" -eq 0 ] && [ ${#pids[@]} -gt 0 ]; then
    echo "demo: stopping the local cluster"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
}
trap cleanup EXIT

"$bin/ddp-coordinator" --listen "$DDP_COORDINATOR" --state-dir "$demo/state" \
  ${coordinator_tls[@]+"${coordinator_tls[@]}"} >"$demo/logs/coordinator.log" 2>&1 &
pids+=($!)
# Two CPU workers on this machine, splitting its cores.
cpus=$(( $(nproc) / 2 )); [ "$cpus" -lt 1 ] && cpus=1
for w in worker-1 worker-2; do
  [ "$secure" -eq 1 ] && worker_tls=(--tls-ca "$demo/certs/ca.pem" --tls-cert "$demo/certs/$w.pem"
                                     --tls-key "$demo/certs/$w.key")
  "$bin/ddp-worker" ${worker_tls[@]+"${worker_tls[@]}"} --coordinator "$DDP_COORDINATOR" --name "$w" --slots 1 --cpus "$cpus" \
    --work-dir "$demo/$w" >"$demo/logs/$w.log" 2>&1 &
  pids+=($!)
done

# Wait for both workers to register (ddpctl fails until the coordinator is up).
for _ in $(seq 1 100); do
  alive=$("$bin/ddpctl" workers -o json 2>/dev/null | grep -o '"alive":true' | wc -l || true)
  [ "$alive" -ge 2 ] && break
  sleep 0.1
done
echo "demo: coordinator on $DDP_COORDINATOR$([ "$secure" -eq 1 ] && echo ", mutual TLS and tokens (.demo/certs)") (logs in .demo/logs)"
"$bin/ddpctl" workers
echo
echo "demo: ddpctl submit examples/cancer.yaml --watch"
set +e
"$bin/ddpctl" submit examples/cancer.yaml --watch
status=$?
set -e
job=$("$bin/ddpctl" list -o json | grep -o '"id":"[^"]*"' | head -1 | cut -d'"' -f4)
echo
echo "demo: ddpctl get $job   (rank table, epochs)"
"$bin/ddpctl" get "$job"
echo
echo "demo: ddpctl logs $job --rank 1 --tail 4"
"$bin/ddpctl" logs "$job" --rank 1 --tail 4
if [ "$keep" -eq 1 ]; then
  echo
  echo "demo: the cluster keeps running (pids ${pids[*]}). Try:"
  echo "  export DDP_COORDINATOR=$DDP_COORDINATOR"
  if [ "$secure" -eq 1 ]; then
    echo "  export DDP_TLS_CA=$DDP_TLS_CA DDP_TOKEN=\$(cat $demo/certs/user.token)"
  fi
  echo "  $bin/ddpctl submit examples/fashion_mnist_cnn.yaml --watch"
  echo "  $bin/ddpctl list; $bin/ddpctl workers"
  echo "  kill ${pids[*]}   # to stop it"
fi
exit "$status"
