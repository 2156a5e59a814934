#!/usr/bin/env bash
# deploy/slurm/ddp-workers.sbatch's flags for ddp-worker, without Slurm: a fake srun
# runs the per-task command once with the Slurm variables a task would have, and a
# fake ddp-worker prints its arguments. What the name, labels, GPUs and CPUs come out
# as for one or several tasks per node, with and without Slurm's GPU variables, and
# that the agent's work dir is removed after it.
# (slurm_test.py runs the script under a real Slurm.)
#   slurm_script_test.sh SOURCE_DIR
set -euo pipefail
script="$1/deploy/slurm/ddp-workers.sbatch"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/path"
printf '#!/bin/sh\nprintf "%%s\\n" "$@"\n' >"$tmp/bin/ddp-worker"
# srun: run the task command (all arguments after srun's own flags) as one task.
cat >"$tmp/path/srun" <<'EOF'
#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done
exec "$@"
EOF
chmod +x "$tmp/bin/ddp-worker" "$tmp/path/srun"
failures=0

# run VAR=VALUE... -- [script args]: the worker's arguments, one a line.
run() {
  local -a vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  env -i PATH="$tmp/path:/usr/bin:/bin" TMPDIR="$tmp" DDP_BIN="$tmp/bin" DDP_COORDINATOR=10.0.0.1:29400 \
    SLURM_JOB_ID=42 SLURMD_NODENAME=n1 SLURM_JOB_PARTITION=gpu SLURM_LOCALID=0 SLURM_NODEID=0 \
    SLURM_NTASKS=1 SLURM_STEP_TASKS_PER_NODE=1 SLURM_CPUS_ON_NODE=8 "${vars[@]}" \
    bash "$script" "$@" 2>&1 | grep -v '^ddp-workers.sbatch: job'
}
# expect NAME "FLAG VALUE"... : each pair must be in the output, adjacent.
expect() {
  local what=$1 out=$2
  shift 2
  for pair in "$@"; do
    if ! printf ' %s ' "$(tr '\n' ' ' <<<"$out")" | grep -qF -- " $pair "; then
      echo "FAIL: $what: no '$pair' in:"; tr '\n' ' ' <<<"$out"; echo
      failures=$((failures + 1))
    fi
  done
}

out=$(run --)
expect "one task per node" "$out" "--name n1-42" "--label slurm_job=42" \
  "--label slurm_partition=gpu" "--leave-on-exit --gpus" "--gpus none" "--cpus 8" \
  "--coordinator 10.0.0.1:29400"

work_dir=$(grep -A1 -x -- --work-dir <<<"$out" | tail -1)
case "$work_dir" in
  "$tmp"/ddp-worker-n1-42.*) [ ! -e "$work_dir" ] || { echo "FAIL: $work_dir was left behind"; failures=$((failures + 1)); } ;;
  *) echo "FAIL: the work dir is '$work_dir', not a new one under \$TMPDIR"; failures=$((failures + 1)) ;;
esac

out=$(run SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_STEP_TASKS_PER_NODE="1,2(x2)" -- --stop-grace 5s)
expect "the second of two tasks on the second node" "$out" "--name n1-42-1" "--cpus 4" \
  "--stop-grace 5s"

out=$(run SLURM_NODEID=2 SLURM_STEP_TASKS_PER_NODE="2(x2),1" SLURM_CPUS_PER_TASK=3 --)
expect "the one task of the third node, --cpus-per-task" "$out" "--name n1-42" "--cpus 3"

out=$(run CUDA_VISIBLE_DEVICES=2,3 SLURM_STEP_GPUS=0,1,2,3 --)
expect "the task's own GPUs first" "$out" "--gpus 2,3"
out=$(run SLURM_STEP_GPUS=4,5 SLURM_JOB_GPUS=4,5,6,7 --)
expect "the step's GPUs" "$out" "--gpus 4,5"
out=$(run SLURM_JOB_GPUS=6 --)
expect "the job's GPUs" "$out" "--gpus 6"
out=$(run CUDA_VISIBLE_DEVICES=NoDevFiles --)
expect "no GPU file" "$out" "--gpus none"
out=$(run DDP_GPUS=all CUDA_VISIBLE_DEVICES=1 --)
expect "DDP_GPUS wins" "$out" "--gpus all"

out=$(run DDP_WORKER_NAME=%n DDP_TLS_CA=/pki/ca.pem DDP_TLS_CERT=/pki/%n.pem \
      DDP_TLS_KEY=/pki/%n-%j-%t.key DDP_WORKER_TOKEN_FILE=/pki/%n.token DDP_SLOTS=2 \
      DDP_WORKER_FLAGS="--allow-root /srv/ddp --label pool=a" --)
expect "secure, named after the node" "$out" "--name n1" "--tls-ca /pki/ca.pem" \
  "--tls-cert /pki/n1.pem" "--tls-key /pki/n1-42-0.key" "--token-file /pki/n1.token" \
  "--slots 2" "--allow-root /srv/ddp" "--label pool=a"

if out=$(env -i PATH="$tmp/path:/usr/bin:/bin" DDP_BIN="$tmp/bin" SLURM_JOB_ID=42 \
         bash "$script" 2>&1); then
  echo "FAIL: no coordinator was accepted: $out"; failures=$((failures + 1))
fi
expect "no coordinator" "$out" "set DDP_COORDINATOR=HOST:PORT (or pass --coordinator HOST:PORT)"
if out=$(env -i PATH="$tmp/path:/usr/bin:/bin" DDP_BIN="$tmp/bin" DDP_COORDINATOR=x:1 \
         bash "$script" 2>&1); then
  echo "FAIL: ran outside Slurm: $out"; failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] && echo "PASS" || exit 1
