#!/usr/bin/env bash
# Builds llm.c's train_gpt2cu (github.com/karpathy/llm.c) for the GPU bench's anchor side
# (bench/gpu/bench.py, side "llm.c"), in the llm.c source folder given:
#
#   bash bench/gpu/llmc_build.sh DIR     # -> DIR/train_gpt2cu, its log in DIR/build.log
#
# llm.c's own Makefile, with USE_CUDNN=0 (its own attention kernels, no cuDNN flash
# attention), NO_MULTI_GPU=1 and NO_USE_MPI=1 (one GPU, nothing but cuBLAS to link),
# GPU_COMPUTE_CAPABILITY=${LLMC_ARCH:-90} (H100 and H200: sm_90; nvidia-smi is not
# asked, so it builds where no GPU is), and -lnvidia-ml only where <nvml.h> is found
# (llm.c uses NVML only then; the CUDA 13 toolkit here ships no libnvidia-ml to link).
# LLMC_LIB_DIRS (colon-separated) adds library folders to link from, e.g. torch's
# nvidia/cu13/lib where the machine has no CUDA toolkit libraries: a library found there
# only as libX.so.N is linked through a libX.so link made in DIR/.libs.
# One line of llm.c is patched first, idempotently: CUDA 13 dropped the cudaMemAdvise
# overload taking a device number (its managed-memory fallback, used only when
# cudaMalloc runs out of memory); the patch passes a cudaMemLocation on CUDA >= 13.
# The source never enters the project's commits: bench/gpu/pack.sh copies it into
# .gpu-carry/llm.c/ from a local clone (git-ignored).
set -euo pipefail
src=${1:?usage: llmc_build.sh LLMC_SOURCE_DIR}
cd "$src"
[[ -f train_gpt2.cu && -f Makefile && -f llmc/cuda_utils.cuh ]] || {
  echo "llmc_build.sh: $src is not llm.c's source (no train_gpt2.cu, Makefile, llmc/)" >&2; exit 1; }
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $nvcc ]] || { echo "llmc_build.sh: no nvcc (PATH, /usr/local/cuda/bin)" >&2; exit 1; }
old='cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);'
if grep -qF "$old" llmc/cuda_utils.cuh && ! grep -q 'ddp bench: CUDA 13' llmc/cuda_utils.cuh; then
  python3 - llmc/cuda_utils.cuh "$old" <<'PY'
import sys
path, old = sys.argv[1], sys.argv[2]
text = open(path).read()
new = ("// ddp bench: CUDA 13 takes a cudaMemLocation here\n#if CUDART_VERSION >= 13000\n"
       "        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, "
       "cudaMemLocation{cudaMemLocationTypeHost, 0}), file, line);\n#else\n        " + old +
       "\n#endif")
open(path, "w").write(text.replace(old, new, 1))
PY
  echo "llmc_build.sh: patched llmc/cuda_utils.cuh (cudaMemAdvise on CUDA 13)"
fi
libs=(cublas cublasLt)
if echo '#include <nvml.h>' | "$nvcc" -x cu -E - >/dev/null 2>&1; then
  libs+=(nvidia-ml)
fi
ldflags=""
mkdir -p .libs
IFS=: read -r -a dirs <<< "${LLMC_LIB_DIRS:-}"
dirs+=(/usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64/stubs)
for lib in "${libs[@]}"; do
  for d in "${dirs[@]}"; do
    [[ -n $d && -d $d ]] || continue
    if [[ -e $d/lib$lib.so ]]; then
      ldflags+=" -L$d"
      break
    fi
    versioned=$(ls "$d"/lib"$lib".so.[0-9]* 2>/dev/null | head -1)
    if [[ -n $versioned ]]; then
      ln -sf "$versioned" ".libs/lib$lib.so"
      ldflags+=" -L$PWD/.libs"
      break
    fi
  done
  ldflags+=" -l$lib"
done
export PATH=$(dirname "$nvcc"):$PATH
echo "llmc_build.sh: make train_gpt2cu in $src (sm_${LLMC_ARCH:-90}, $($nvcc --version | tail -1))"
start=$(date +%s)
if ! make train_gpt2cu USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 \
     GPU_COMPUTE_CAPABILITY="${LLMC_ARCH:-90}" NVCC_LDFLAGS="$ldflags" > build.log 2>&1; then
  tail -20 build.log >&2
  echo "llmc_build.sh: the build failed (log: $src/build.log)" >&2
  exit 1
fi
echo "llmc_build.sh: $src/train_gpt2cu built in $(( $(date +%s) - start )) s"
