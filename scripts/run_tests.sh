#!/usr/bin/env bash
# The README's test command: installs what the build needs (Debian 12 packages),
# builds everything from scratch into build/ (and, with clang, the fuzz targets into
# build/fuzz), and runs every test with ctest, side by side (docs/testing.md: each
# test's PROCESSORS is its share of the machine, the timing-sensitive ones run alone), a
# fixed-iteration run of each fuzz target included. Then the second LibTorch flavour
# (docs/torch.md): PyPI's torch 2.11 (its CUDA build) in .venv-torch2, where a
# command-job test also runs a PyTorch 2.x script; ddp built against it into
# build-torch2, only what its tests and the GPU check need (scripts/ctest_targets.py);
# and the engine's tests there (labels trainer and engine): the trainer's (unit,
# parity, training, checkpoints, failures) and libddp's (unit, parity, torchrun's agent
# store, the installed package and a libddp program run as a command job). Last, the
# GPU check's rehearsal (bench/gpu/, docs/torch.md): its packing (the engine from
# build-torch2), and its one command's dry run on the CPU (the prebuilt engine, as a
# GPU machine takes it, the GPU tests, the full stack, the parity checks, the GPU bench).
#   scripts/run_tests.sh [ctest args...]     e.g. -L unit, -R trainer, -L fuzz
#   scripts/run_tests.sh --quick             the contributors' tier (docs/testing.md)
# With ctest arguments only the Debian flavour runs, with them; DDP_TORCH2=0 skips the
# PyPI flavour, DDP_TORCH2=1 runs it whatever the arguments. --quick builds what the
# Debian flavour's unit tests (every component's) and the engine's parity with PyTorch
# (the trainer's and libddp's) need, and runs those, nothing else.
# DDP_TEST_JOBS (default 4 per core) is ctest's -j: the shares (PROCESSORS) of the
# tests that run at once add up to at most that.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
  [ $# -eq 0 ] || { echo "run_tests.sh: --quick takes no ctest arguments" >&2; exit 2; }
fi
torch2=${DDP_TORCH2:-$([ $# -eq 0 ] && [ $quick = 0 ] && echo 1 || echo 0)}
jobs=${DDP_TEST_JOBS:-$((4 * $(nproc)))}
ctest_run() { ctest --output-on-failure --timeout 1200 -j "$jobs" "$@"; }

# The phase table: every phase's seconds, printed at the end of every run, passed or not
# (docs/testing.md keeps cold and warm figures).
phases=() phase_name="" phase_start=0 run_start=$(date +%s)
phase() {  # phase NAME: the previous phase ends, NAME begins
  local now; now=$(date +%s)
  [ -z "$phase_name" ] || phases+=("$phase_name|$((now - phase_start))")
  phase_name=$1 phase_start=$now
}
phase_table() {  # phase_table EXIT_STATUS
  local rc=${1:-0}
  phase ""
  echo "== phases ($( [ $rc -eq 0 ] && echo passed || echo "failed, exit $rc"))"
  printf '| %-56s | %7s |\n' phase seconds; echo '|---|---:|'
  for p in "${phases[@]}"; do printf '| %-56s | %7s |\n' "${p%|*}" "${p##*|}"; done
  printf '| %-56s | %7s |\n' "in all" "$(( $(date +%s) - run_start ))"
}
trap 'phase_table $?' EXIT

phase "install: Debian packages, test tools, the torch 2.11 venv"
bash scripts/install_deps.sh
# TensorBoard's reader, which the export test reads `ddpctl tensorboard`'s files with.
bash scripts/install_test_tools.sh
# The venv first: the Debian flavour's command-job test runs a PyTorch 2.x script in it.
[ "$torch2" != 1 ] || bash scripts/install_torch2.sh
# clang for a new build dir (scripts/cmake_compiler.sh, decision 183).
# shellcheck disable=SC2046
configure_debian() { cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_FUZZ=ON \
  $(bash scripts/cmake_compiler.sh build); }
if [ $quick = 1 ]; then
  # The engine's parity: ddp-trainer's per-step losses and libddp's (plain DDP, the
  # autograd graph's options, hooks, ZeRO, Join, SyncBatchNorm, the data loader, the fused
  # optimizers) against PyTorch's own DDP run live.
  parity='^(trainer_equivalence_test|library_parity_test|ddp_graph_parity_test|comm_hook_parity_test|zero_parity_test|join_parity_test|sync_batch_norm_parity_test|data_loader_parity_test|fused_optimizer_parity_test)$'
  phase "quick: configure, build what the unit and parity tests need"
  configure_debian
  # shellcheck disable=SC2046
  cmake --build build -j "$(nproc)" --target $(python3 scripts/ctest_targets.py build -L unit) \
    $(python3 scripts/ctest_targets.py build -R "$parity")
  phase "quick: unit tests ($(cd build && ctest -N -L unit | tail -n1 | grep -oE '[0-9]+'))"
  (cd build && ctest_run -L unit)
  phase "quick: the engine's parity with PyTorch ($(cd build && ctest -N -R "$parity" | tail -n1 | grep -oE '[0-9]+'))"
  (cd build && ctest_run -R "$parity")
  exit 0
fi
phase "Debian flavour: configure and build (fuzzers included)"
configure_debian
cmake --build build -j "$(nproc)"
phase "Debian flavour: tests ($(cd build && ctest -N "$@" | tail -n1 | grep -oE '[0-9]+') tests)"
(cd build && ctest_run "$@")
# What the multi-host tests measured: the partition timings and the chaos soak's seed and
# fault count (ctest keeps every test's output in its log).
grep -hE '^(chaos soak: |[a-z]+: lost declared after|outage: [0-9]|data: the stall)' \
  build/Testing/Temporary/LastTest.log 2>/dev/null || true

[ "$torch2" = 1 ] || exit 0
echo "== the PyPI flavour: torch 2.11 (docs/torch.md)"
phase "PyPI flavour: configure and build what its tests and the GPU check need"
# shellcheck disable=SC2046
cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDDP_TORCH_PYTHON="$here/.venv-torch2/bin/python" -DDDP_REQUIRE_CUDA=ON \
  $(bash scripts/cmake_compiler.sh build-torch2)
# The engine's tests (labels trainer and engine: scripts/ctest_targets.py reads what
# they run), and the engine bench/gpu/pack.sh carries to a GPU machine.
torch2_tests='^(trainer|engine)$'
# shellcheck disable=SC2046
cmake --build build-torch2 -j "$(nproc)" \
  --target $(python3 scripts/ctest_targets.py build-torch2 -L "$torch2_tests") \
  ddp ddp-trainer ddp-bench-gpu ddp-gpt-example libddp_cuda_test cuda_graph_test \
  libddp_fused_optimizer_program
phase "PyPI flavour: the engine's tests ($(cd build-torch2 && ctest -N -L "$torch2_tests" | tail -n1 | grep -oE '[0-9]+'))"
(cd build-torch2 && ctest_run -L "$torch2_tests")
cd "$here"

echo "== the GPU check's rehearsal (bench/gpu/, docs/torch.md)"
phase "GPU rehearsal: pack (the engine of build-torch2), dry run"
DDP_GPU_ENGINE_BUILD="$here/build-torch2" bash bench/gpu/pack.sh
gpu_out=$(mktemp -d)
trap 'rc=$?; rm -rf "$gpu_out"; phase_table $rc' EXIT
# build-gpu/ (the carried packages unpacked, the prebuilt engine, the fallback build's
# configuration) stays, as build/ does, at a fixed place under the tree. The checks run
# side by side (they check values, not speed), the bench last.
OUT=$gpu_out DDP_GPU_WORK="$here/build-gpu" DDP_GPU_PYTHON="$here/.venv-torch2/bin/python" \
  DDP_GPU_PARALLEL_CHECKS=1 bash bench/gpu/run.sh --dry-run
