#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU, CUDA, CMake, ninja, a C++
# compiler and a pip torch built for CUDA, but none of Debian's dev packages and no network
# (docs/torch.md, "The GPU check"). From the repository's root, after bench/gpu/pack.sh
# made .gpu-carry/ (carried along with the tree):
#
#   bash bench/gpu/run.sh              # results in $OUT (or ./gpu-out)
#   bash bench/gpu/run.sh --dry-run    # the same on a machine without a GPU (CI): CPU, Gloo
#
# 1. unpacks the carried .deb files (dpkg -x; a Python fallback where dpkg is missing);
# 2. builds libddp, ddp-trainer, the GPU bench program and the GPU tests against that
#    machine's torch (DDP_ENGINE_ONLY: nothing else of ddp, only what was carried);
# 3. runs the GPU tests (ctest -L gpu): on a GPU none may skip;
# 4. runs the GPU bench (bench/gpu/bench.py): ddp-trainer and a libddp program against
#    PyTorch's DDP, NCCL at world 1 and Gloo's CUDA path at world 2 on the one GPU.
# Everything it prints goes to $OUT/run.log too; it stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
exec > >(tee -a "$out/run.log") 2>&1
python=${DDP_GPU_PYTHON:-$(command -v python3)}
work=${DDP_GPU_WORK:-/tmp/ddp-gpu}
root=$work/root
build=$work/build
start=$(date +%s)
step() { echo "== $(( $(date +%s) - start )) s: $*"; }

step "the machine"
nproc
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
if (( ! dry_run )); then
  nvidia-smi -L
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no GPU")'
fi

step "unpack .gpu-carry/debs into $root"
ls .gpu-carry/debs/*.deb >/dev/null 2>&1 || { echo "no .gpu-carry/debs: run bench/gpu/pack.sh first, and carry .gpu-carry"; exit 1; }
rm -rf "$root" && mkdir -p "$root"
for deb in .gpu-carry/debs/*.deb; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$root"
  else
    "$python" - "$deb" "$root" <<'PY'
import io, sys, tarfile
deb, root = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb
pos = 8
while pos < len(data):
    name, size = data[pos:pos + 16].decode().strip(), int(data[pos + 48:pos + 58])
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(root)
    pos += 60 + size + (size % 2)
PY
  fi
done

step "configure (DDP_ENGINE_ONLY, torch from $python, dependencies from $root only)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_ENGINE_ONLY=ON \
  -DDDP_TORCH_PYTHON="$python" -DDDP_TORCH_VERSION= -DDDP_REQUIRE_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_IGNORE_PREFIX_PATH=/usr \
  -DCMAKE_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu" -DCMAKE_INCLUDE_PATH="$root/usr/include"

step "build"
cmake --build "$build" --target ddp-trainer ddp-bench-gpu libddp_cuda_test -j"$(nproc)"
nccl=$(nm -DC "$build"/lib/libddp.so | grep -c 'c10d::ProcessGroupNCCL::ProcessGroupNCCL' || true)
(( nccl > 0 )) || { echo "libddp.so does not use c10d::ProcessGroupNCCL: the NCCL path was compiled out"; exit 1; }
echo "libddp.so uses c10d::ProcessGroupNCCL (the NCCL path is compiled in)"

step "the GPU tests"
ctest --test-dir "$build" -L gpu --output-on-failure -V | tee "$out/gpu_tests.log" | grep -E '^\s*[0-9]+: \[ +(OK|SKIPPED|FAILED) +\]|tests passed|Skipped|Failed' || true
grep -q '100% tests passed' "$out/gpu_tests.log" || { echo "the GPU tests failed"; exit 1; }
if (( ! dry_run )) && grep -q '\[  SKIPPED \]' "$out/gpu_tests.log"; then
  echo "a GPU test skipped on a machine with a GPU"; exit 1
fi

step "the GPU bench"
bench_args=(--build "$build" --out "$out" --python "$python")
(( dry_run )) && bench_args+=(--dry-run)
"$python" bench/gpu/bench.py "${bench_args[@]}"

step "done: $out"
ls -la "$out"
