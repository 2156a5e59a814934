#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU, CUDA, CMake, ninja, a C++
# compiler and a pip torch built for CUDA, but none of Debian's dev packages and no network
# (docs/torch.md, "The GPU check"). From the repository's root, after bench/gpu/pack.sh
# made .gpu-carry/ (carried along with the tree):
#
#   bash bench/gpu/run.sh                 # results in $OUT (or ./gpu-out)
#   bash bench/gpu/run.sh --build-there   # build the engine (and llm.c) there even if the
#                                         # carried ones load
#   bash bench/gpu/run.sh --dry-run       # the same on a machine without a GPU (CI): CPU, Gloo
#
# 1. unpacks the carried .deb files (dpkg -x; a Python fallback where dpkg is missing);
# 2. takes the engine pack.sh carried prebuilt (.gpu-carry/prebuilt.tar.xz: ddp-trainer,
#    the GPU bench program and the GPU tests, built against the same torch wheel) if every
#    library it needs loads there; else (and always with --build-there) builds libddp,
#    ddp-trainer, the GPU bench program and the GPU tests against that machine's torch
#    (DDP_ENGINE_ONLY: nothing else of ddp, only what was carried). A dry run takes the
#    prebuilt engine as a GPU machine would, fails where it loads a library that machine
#    lacks, and configures the fallback build from the carried packages without compiling;
# 3. runs the GPU tests (ctest -L gpu, or the prebuilt test program): on a GPU none may skip;
# 4. runs the GPU bench (bench/gpu/bench.py): GPT-2 124M under ddp-trainer, the libddp
#    GPT example, PyTorch's DDP eager and with torch.compile, and llm.c (the carried
#    .gpu-carry/llm.c/train_gpt2cu where it loads, else built there from the carried
#    source); the MLP, CNN and ResNet-18 under ddp-trainer and a libddp program with and
#    without whole-step CUDA graphs, against PyTorch's DDP eager and with
#    torch.compile(mode="reduce-overhead"), NCCL at world 1;
# 5. runs the full stack (bench/gpu/stack.py): the carried ddp-coordinator, ddp-worker and
#    ddpctl (.gpu-carry/stack.tar.xz, built on Debian 12 with their libraries) running jobs
#    whose trainers are step 2's ddp-trainer, on the carried Fashion-MNIST;
# 6. holds ddp-trainer's per-step losses on the GPU, fp32 and bf16, to PyTorch's own DDP
#    under torch.autocast("cuda"), the MLP's and model.gpt's, and the whole-step CUDA graph
#    to the same step run eagerly (bench/gpu/parity.py);
# 7. holds libddp's fused optimizers to torch.optim's fused=True on the device, a captured
#    CUDA graph of their step included (tests/libddp/fused_optimizer_parity_test.py).
# Everything it prints goes to $OUT/run.log too. A failed build stops it; steps 3 to 7 each
# run whatever the others gave, and it exits 1 at the end naming those that failed.
# DDP_GPU_STEPS (default tests,stack,parity,fused,bench) picks which of steps 3 to 7 run.
set -euo pipefail
cd "$(dirname "$0")/../.."
dry_run=0
build_there=0
for arg in "$@"; do
  case $arg in
    --dry-run) dry_run=1 ;;
    --build-there) build_there=1 ;;
    *) echo "run.sh: unknown argument '$arg' (--dry-run, --build-there)" >&2; exit 2 ;;
  esac
done
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
exec > >(tee -a "$out/run.log") 2>&1
python=${DDP_GPU_PYTHON:-$(command -v python3)}
work=${DDP_GPU_WORK:-/tmp/ddp-gpu}
root=$work/root
build=$work/build
start=$(date +%s)
step() { echo "== $(( $(date +%s) - start )) s: $*"; }
failed=()

step "the machine"
nproc
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
echo "glibc $(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
torch_lib=$("$python" -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
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

# What the engine's programs load beyond their RUNPATH: torch's libraries, and the carried
# packages' (absl's own libraries need each other, and a prebuilt engine's RUNPATH names
# this machine's paths, not that one's).
root_lib=$root/usr/lib/x86_64-linux-gnu
prebuilt=0
# What a machine without Debian's packages has of the libraries the engine's programs load:
# torch's (its lib/ and its nvidia-* wheels, under site-packages), the carried packages',
# the prebuilt's own, the CUDA toolkit's (CUDA_HOME, default /usr/local/cuda: the runtime
# the engine links) and the base system's. A dry run here, where ldd finds all of
# Debian's, names the rest: the GPU machine would not find them.
site_packages=$(dirname "$(dirname "$torch_lib")")
cuda_home=${CUDA_HOME:-/usr/local/cuda}
foreign_libs() {  # foreign_libs FILE...: "soname (path)" of each library from elsewhere
  # A library counts by where it is, its links followed: a machine whose ld.so.conf names
  # /usr/local/lib, where libcudart.so.13 links into the toolkit, loads the toolkit's.
  local allowed=() dir soname path real
  for dir in "$site_packages" "$root" "$work/prebuilt" "$cuda_home"; do
    allowed+=("$dir/" "$(realpath -m "$dir")/")
  done
  LD_LIBRARY_PATH="$torch_lib:$root_lib:$work/prebuilt/lib" ldd "$@" 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
    while read -r soname path; do
      [[ $soname =~ ^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libz|libstdc\+\+|libgcc_s)\.so ]] &&
        continue
      real=$(realpath -m "$path")
      for dir in "${allowed[@]}"; do
        [[ $path == "$dir"* || $real == "$dir"* ]] && continue 2
      done
      echo "$soname ($path)"
    done
}
if (( ! build_there )) && [[ -f .gpu-carry/prebuilt.tar.xz ]]; then
  step "the prebuilt engine (.gpu-carry/prebuilt.tar.xz) into $work/prebuilt"
  rm -rf "$work/prebuilt" && mkdir -p "$work/prebuilt"
  tar -C "$work/prebuilt" -xJf .gpu-carry/prebuilt.tar.xz
  cat "$work/prebuilt/VERSION" 2>/dev/null || true
  missing=$(LD_LIBRARY_PATH="$torch_lib:$root_lib:$work/prebuilt/lib" \
            ldd "$work"/prebuilt/bin/* 2>&1 | grep 'not found' | sort -u || true)
  built_for=$(sed -n 's/^torch //p' "$work/prebuilt/VERSION" 2>/dev/null || true)
  here=$("$python" -c 'import torch; print(torch.__version__)')
  if [[ -n $built_for && $built_for != "$here" ]]; then
    missing="built against torch $built_for, this machine has $here"
  fi
  if (( dry_run )) && [[ -z $missing ]]; then
    missing=$(foreign_libs "$work"/prebuilt/bin/* "$work"/prebuilt/lib/*.so*)
    [[ -z $missing ]] || missing="it loads libraries a GPU machine lacks: $missing"
  fi
  if [[ -z $missing ]]; then
    echo "every library of the prebuilt engine loads here: using it (--build-there builds instead)"
    build=$work/prebuilt
    prebuilt=1
  elif (( dry_run )); then
    # The GPU machine would build instead, minutes of a short lease: CI's rehearsal fails.
    echo "the prebuilt engine would not load on a GPU machine: $missing"
    exit 1
  else
    echo "the prebuilt engine does not fit here, building it instead:"
    echo "$missing"
  fi
fi
engine_ld=$torch_lib:$root_lib:$build/lib

configure_engine() {  # configure_engine BUILD_DIR: the engine alone, from what was carried
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_ENGINE_ONLY=ON \
    -DDDP_TORCH_PYTHON="$python" -DDDP_TORCH_VERSION= -DDDP_REQUIRE_CUDA=ON \
    -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_IGNORE_PREFIX_PATH=/usr \
    -DCMAKE_LIBRARY_PATH="$root_lib" -DCMAKE_INCLUDE_PATH="$root/usr/include"
}
if (( prebuilt && dry_run )); then
  # The build a GPU machine falls back on, configured from the carried packages alone
  # (every dependency found there, the graph generated); its compile is the one the
  # prebuilt engine had, against the same torch: `--dry-run --build-there` runs it too.
  step "configure the fallback build (DDP_ENGINE_ONLY, dependencies from $root only)"
  configure_engine "$work/fallback" > "$out/fallback_configure.log" 2>&1 ||
    { cat "$out/fallback_configure.log"; echo "the fallback build does not configure"; exit 1; }
  ninja -C "$work/fallback" -n ddp-trainer ddp-bench-gpu ddp-gpt-example libddp_cuda_test \
    cuda_graph_test libddp_fused_optimizer_program > /dev/null ||
    { echo "the fallback build's graph lacks a target"; exit 1; }
  echo "the fallback build configures from the carried packages"
fi
if (( ! prebuilt )); then
  step "configure (DDP_ENGINE_ONLY, torch from $python, dependencies from $root only)"
  configure_engine "$build"

  step "build"
  cmake --build "$build" --target ddp-trainer ddp-bench-gpu ddp-gpt-example libddp_cuda_test \
    cuda_graph_test libddp_fused_optimizer_program -j"$(nproc)"
fi
nccl=$(nm -DC "$build"/lib/libddp.so | grep -c 'c10d::ProcessGroupNCCL::ProcessGroupNCCL' || true)
(( nccl > 0 )) || { echo "libddp.so does not use c10d::ProcessGroupNCCL: the NCCL path was compiled out"; exit 1; }
echo "libddp.so uses c10d::ProcessGroupNCCL (the NCCL path is compiled in)"
graphs=$(nm -DC "$build"/lib/libddp.so | grep -c 'at::cuda::CUDAGraph::capture_begin' || true)
(( graphs > 0 )) || { echo "libddp.so does not use at::cuda::CUDAGraph: the CUDA-graph capture was compiled out"; exit 1; }
echo "libddp.so uses at::cuda::CUDAGraph (whole-step CUDA graphs are compiled in)"

gpu_tests() {
  if (( prebuilt )); then  # No CTest files: the test programs, as ctest runs them.
    local rc=0 t
    : > "$out/gpu_tests.log"
    # DDP_GPU_TEST_FILTER: a gtest filter for libddp_cuda_test (a short lease's subset).
    LD_LIBRARY_PATH=$engine_ld timeout 300 "$build/bin/libddp_cuda_test" \
      ${DDP_GPU_TEST_FILTER:+--gtest_filter=$DDP_GPU_TEST_FILTER} >> "$out/gpu_tests.log" 2>&1 || rc=$?
    LD_LIBRARY_PATH=$engine_ld timeout 300 "$build/bin/cuda_graph_test" >> "$out/gpu_tests.log" 2>&1 || rc=$?
    grep -E '^\[ +(OK|SKIPPED|FAILED|PASSED) +\]' "$out/gpu_tests.log" || true
    (( rc == 0 )) || { echo "the GPU tests failed (exit $rc)"; return 1; }
  else
    LD_LIBRARY_PATH=$engine_ld ctest --test-dir "$build" -L gpu --output-on-failure -V |
      tee "$out/gpu_tests.log" |
      grep -E '^\s*[0-9]+: \[ +(OK|SKIPPED|FAILED) +\]|tests passed|Skipped|Failed' || true
    grep -q '100% tests passed' "$out/gpu_tests.log" || { echo "the GPU tests failed"; return 1; }
  fi
  # WithoutAGpu* tests are for machines without one: they skip on a GPU, and only they may.
  if (( ! dry_run )) && grep -E '\[  SKIPPED \] [A-Za-z0-9_]+\.' "$out/gpu_tests.log" |
                         grep -qv 'WithoutAGpu'; then
    echo "a GPU test skipped on a machine with a GPU"; return 1
  fi
}

gpu_parity() {
  local args=(--build "$build" --out "$out" --python "$python" --ld-library-path "$engine_ld")
  (( dry_run )) && args+=(--dry-run)
  # DDP_GPU_PARITY_ARGS: more of parity.py's options, e.g. "--configs nccl-w1".
  # shellcheck disable=SC2086
  "$python" bench/gpu/parity.py "${args[@]}" ${DDP_GPU_PARITY_ARGS:-}
}

# Where llm.c's train_gpt2cu finds cuBLAS: the CUDA toolkit's lib64, torch's nvidia wheels.
cuda_lib_dirs() {
  "$python" - <<'PY'
import glob, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
dirs = [d for d in ["/usr/local/cuda/lib64"] if os.path.isdir(d)]
dirs += sorted({os.path.dirname(p) for p in
                glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcublas*.so*"))})
print(":".join(dirs))
PY
}

# llm.c's train_gpt2cu for the GPT bench: the carried one where every library it needs
# loads (and not --build-there), else built here from the carried source; prints its path,
# or nothing (the bench then reports llm.c as not built).
llmc_binary() {
  local carried=.gpu-carry/llm.c/train_gpt2cu src=.gpu-carry/llm.c/src ld missing
  ld=$(cuda_lib_dirs)
  if (( ! build_there )) && [[ -x $carried ]]; then
    missing=$(LD_LIBRARY_PATH=$ld ldd "$carried" 2>&1 | grep 'not found' || true)
    if [[ -z $missing ]]; then
      echo "llm.c: the carried train_gpt2cu loads here ($(cat .gpu-carry/llm.c/VERSION 2>/dev/null))" >&2
      echo "$PWD/$carried"
      return 0
    fi
    echo "llm.c: the carried train_gpt2cu does not load here, building it: $missing" >&2
  fi
  if [[ ! -f $src/train_gpt2.cu ]]; then
    echo "llm.c: no .gpu-carry/llm.c/src (pack.sh with DDP_LLMC_SRC): its side is not built" >&2
    return 0
  fi
  rm -rf "$work/llm.c" && mkdir -p "$work/llm.c" && cp -a "$src"/. "$work/llm.c/"
  if LLMC_LIB_DIRS=$ld bash bench/gpu/llmc_build.sh "$work/llm.c" >&2; then
    echo "$work/llm.c/train_gpt2cu"
  fi
}

# ddp::FusedAdamW, FusedAdam and FusedSGD against torch.optim's fused=True on the device,
# bit for bit, a captured CUDA graph of the step included on a GPU
# (tests/libddp/fused_optimizer_parity_test.py).
gpu_fused() {
  local device=cuda
  (( dry_run )) && device=cpu
  LD_LIBRARY_PATH=$engine_ld "$python" tests/libddp/fused_optimizer_parity_test.py \
    "$build/bin/libddp_fused_optimizer_program" --device "$device" > "$out/fused_parity.log" 2>&1
  local rc=$?
  grep -E '^\{|^(OK|FAILED)|Ran [0-9]+ test' "$out/fused_parity.log" || true
  (( rc == 0 )) || { echo "the fused optimizers' parity failed (exit $rc)"; return 1; }
}

gpu_bench() {
  local args=(--build "$build" --out "$out" --python "$python" --ld-library-path "$engine_ld")
  (( dry_run )) && args+=(--dry-run)
  if (( ! dry_run )); then
    args+=(--llmc-bin "$(llmc_binary)")
  fi
  # DDP_GPU_BENCH_ARGS: more of bench.py's options, e.g. "--repeats 3 --models mlp,cnn",
  # "--parts gpt", "--gpt-batch 16", "--deadline 240".
  # shellcheck disable=SC2086
  "$python" bench/gpu/bench.py "${args[@]}" ${DDP_GPU_BENCH_ARGS:-}
}

full_stack() {
  if [[ ! -f .gpu-carry/stack.tar.xz ]]; then
    echo "no .gpu-carry/stack.tar.xz (pack.sh packs it from build/bin)"
    (( dry_run )) && { echo "dry run: the full stack skipped"; return 0; }
    return 1
  fi
  local stack=$work/stack data=.gpu-carry/fashion-mnist
  rm -rf "$stack" && mkdir -p "$stack"
  tar -C "$stack" -xJf .gpu-carry/stack.tar.xz
  if [[ ! -d $data ]] && (( dry_run )); then
    data=${DDP_FMNIST:-/usr/share/datasets/fashion-mnist}
  fi
  # The control plane loads only its own lib/ (and glibc, libstdc++, libgcc_s of the machine).
  if ! LD_LIBRARY_PATH=$stack/lib "$stack/bin/ddpctl" --version; then
    echo "the carried control plane does not load here:"
    LD_LIBRARY_PATH=$stack/lib ldd "$stack"/bin/* | grep 'not found' | sort -u
    return 1
  fi
  # The worker gets the engine's libraries first and the control plane's last: its trainers
  # inherit its LD_LIBRARY_PATH, and torch's and this machine's libraries must win there.
  local args=(--bin "$stack/bin" --trainer "$build/bin/ddp-trainer" --data "$data" --out "$out"
              --ctl-lib "$stack/lib" --trainer-lib "$engine_ld" --python "$python")
  (( dry_run )) && args+=(--dry-run)
  "$python" bench/gpu/stack.py "${args[@]}"
}

steps=,${DDP_GPU_STEPS:-tests,stack,parity,fused,bench},
# The checks (tests, stack, parity, fused) one after another, or, with
# DDP_GPU_PARALLEL_CHECKS=1, side by side (they check values, not speed: a short device
# lease finishes them sooner), each into its own log, printed when all are done. The bench
# always runs alone, last: its timings come last where a command's time limit would cut them.
checks=()
[[ $steps == *,tests,* ]] && checks+=("tests:the GPU tests:gpu_tests")
[[ $steps == *,stack,* ]] && checks+=("stack:the full stack:full_stack")
[[ $steps == *,parity,* ]] && checks+=("parity:parity with PyTorch's DDP and the graphs' with eager steps:gpu_parity")
[[ $steps == *,fused,* ]] && checks+=("fused:the fused optimizers against torch.optim's fused=True:gpu_fused")
if [[ ${DDP_GPU_PARALLEL_CHECKS:-0} == 1 ]]; then
  step "the checks, side by side: ${checks[*]%%:*}"
  pids=()
  for c in "${checks[@]}"; do
    IFS=: read -r name _ fn <<< "$c"
    ( set +e; "$fn" > "$out/check_$name.out" 2>&1; echo $? > "$out/check_$name.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  for c in "${checks[@]}"; do
    IFS=: read -r name what fn <<< "$c"
    step "$what (rc $(cat "$out/check_$name.rc" 2>/dev/null || echo '?'))"
    cat "$out/check_$name.out" 2>/dev/null || true
    [[ $(cat "$out/check_$name.rc" 2>/dev/null) == 0 ]] || failed+=("$what")
  done
else
  for c in "${checks[@]}"; do
    IFS=: read -r name what fn <<< "$c"
    step "$what"
    "$fn" || failed+=("$what")
  done
fi
if [[ $steps == *,bench,* ]]; then
  step "the GPU bench"
  gpu_bench || failed+=("the GPU bench")
fi

step "done: $out"
ls -la "$out"
if (( ${#failed[@]} )); then
  printf 'run.sh: failed: %s\n' "$(IFS=,; echo "${failed[*]}")"
  exit 1
fi
