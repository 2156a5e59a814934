#!/usr/bin/env bash
# Makes what the GPU check carries into .gpu-carry/ (git ignores it), for a machine that
# has a GPU, CUDA, CMake, ninja, a compiler and a pip torch but none of Debian's packages
# and no network (docs/torch.md, "The GPU check"):
#
#   debs/              the Debian 12 packages bench/gpu/run.sh builds libddp and
#                      ddp-trainer from there (absl, yaml-cpp, GoogleTest, zlib): .deb files
#   stack.tar.xz       the control plane built here ($DDP_STACK_BUILD, default build):
#                      bin/ddp-coordinator, ddp-worker, ddpctl (stripped) and lib/ every
#                      shared library they load but glibc's, libstdc++ and libgcc_s (the
#                      GPU machine's own must be used: torch needs its newer ones)
#   prebuilt.tar.xz    the engine built here against the same torch wheel
#                      ($DDP_GPU_ENGINE_BUILD: a build tree, as the PyPI flavour's
#                      build-torch2 that scripts/run_tests.sh names; default
#                      $DDP_GPU_WORK/build, made by `run.sh --dry-run --build-there`):
#                      bin/ddp-trainer, ddp-bench-gpu, libddp_cuda_test and
#                      lib/libddp.so*, stripped; run.sh uses it where it loads, and
#                      builds there where it does not
#   fashion-mnist/     Debian's Fashion-MNIST ($DDP_FMNIST, default
#                      /usr/share/datasets/fashion-mnist), for bench/gpu/stack.py
#   llm.c/             karpathy/llm.c, the GPT bench's anchor: src/ (its source, from
#                      $DDP_LLMC_SRC: a clone, bare or not, whose HEAD is taken, or a
#                      plain source folder), train_gpt2cu (built here from src/ by
#                      bench/gpu/llmc_build.sh for sm_90 with this machine's nvcc) and
#                      VERSION. Without $DDP_LLMC_SRC an llm.c/ packed before is kept.
#                      llm.c's source never enters the project's commits (.gpu-carry/
#                      is ignored); run.sh builds it there where the binary does not load
#
# A part whose inputs are missing is left out, saying so (CI runs this before the dry run
# that makes build-gpu). Then checks that the repository's working tree and that folder,
# which a device call sends, stay under the 64 MiB it takes.
#
#   bash bench/gpu/pack.sh            # then, on the GPU machine: bash bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
limit_mib=64
stack_build=${DDP_STACK_BUILD:-build}
gpu_work=${DDP_GPU_WORK:-build-gpu}
engine_build=${DDP_GPU_ENGINE_BUILD:-$gpu_work/build}
fmnist=${DDP_FMNIST:-/usr/share/datasets/fashion-mnist}
pkgs=(libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 libgtest-dev libgmock-dev
      zlib1g-dev zlib1g)
carry=.gpu-carry
mkdir -p "$carry/debs"
rm -f "$carry"/debs/*.deb
# (As root, apt warns that _apt cannot write here and downloads unsandboxed: harmless.)
(cd "$carry/debs" && apt-get download "${pkgs[@]}" >/dev/null 2> >(grep -v unsandboxed >&2)) || {
  echo "pack.sh: apt-get download failed: run 'apt-get update' (Debian 12's archive must be reachable)" >&2
  exit 1
}
debs=$(ls "$carry"/debs/*.deb | wc -l)
if [[ $debs -ne ${#pkgs[@]} ]]; then
  echo "pack.sh: expected ${#pkgs[@]} .deb files, got $debs" >&2
  exit 1
fi

mib() { awk -v b="$(du -sb "$1" | cut -f1)" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
# Warns when sources changed after a build: what is carried would not be what is checked in.
stale() {  # stale BINARY DIR...
  local n
  n=$(find "${@:2}" -newer "$1" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.proto' \
        -o -name CMakeLists.txt -o -name '*.cmake' \) 2>/dev/null | wc -l)
  if (( n > 0 )); then
    echo "pack.sh: warning: $n source files changed after $1 was built: rebuild it first" >&2
  fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The control plane, with the Debian 12 libraries it loads.
stack_bins=(ddp-coordinator ddp-worker ddpctl)
if ! ls "${stack_bins[@]/#/$stack_build/bin/}" >/dev/null 2>&1; then
  rm -f "$carry/stack.tar.xz"
  echo "pack.sh: no ${stack_bins[*]} in $stack_build/bin: stack.tar.xz left out (the GPU check skips the full stack)"
else
  stale "$stack_build/bin/ddp-coordinator" coordinator worker client common proto
  mkdir -p "$tmp/stack/bin" "$tmp/stack/lib"
  for b in "${stack_bins[@]}"; do
    strip -o "$tmp/stack/bin/$b" "$stack_build/bin/$b"
  done
  if ldd "${stack_bins[@]/#/$stack_build/bin/}" | grep -q 'not found'; then
    echo "pack.sh: the control plane misses libraries here:" >&2
    ldd "${stack_bins[@]/#/$stack_build/bin/}" | grep 'not found' | sort -u >&2
    exit 1
  fi
  # glibc's own (and libresolv, libnss: glibc's too), libstdc++ and libgcc_s stay the machine's.
  ldd "${stack_bins[@]/#/$stack_build/bin/}" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
    sort -u | while read -r soname path; do
      case $soname in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|linux-vdso*|\
        libresolv.so.*|libnss_*|libutil.so.*|libstdc++.so.*|libgcc_s.so.*) continue ;;
      esac
      cp -L "$path" "$tmp/stack/lib/$soname"
    done
  tar -C "$tmp/stack" -cf - bin lib | xz -T0 -6 > "$carry/stack.tar.xz"
  echo "pack.sh: stack.tar.xz: ${stack_bins[*]} from $stack_build/bin ($(mib "$tmp/stack/bin")" \
       "stripped) and $(ls "$tmp/stack/lib" | wc -l) libraries ($(mib "$tmp/stack/lib")): $(mib "$carry/stack.tar.xz")"
fi

# The engine, built here against the torch wheel the GPU machine has.
engine_bins=(ddp-trainer ddp-bench-gpu ddp-gpt-example libddp_cuda_test cuda_graph_test
             libddp_fused_optimizer_program)
if ! ls "${engine_bins[@]/#/$engine_build/bin/}" "$engine_build"/lib/libddp.so.*.*.* >/dev/null 2>&1; then
  rm -f "$carry/prebuilt.tar.xz"
  echo "pack.sh: no ${engine_bins[*]} and libddp.so in $engine_build: prebuilt.tar.xz left out" \
       "(run.sh builds there; make it with DDP_GPU_WORK=\$PWD/$gpu_work bash bench/gpu/run.sh --dry-run --build-there," \
       "or name a build-torch2 in DDP_GPU_ENGINE_BUILD)"
else
  stale "$engine_build/bin/ddp-trainer" trainer libddp common cmake tests/libddp bench/gpu
  mkdir -p "$tmp/prebuilt/bin" "$tmp/prebuilt/lib"
  for b in "${engine_bins[@]}"; do
    strip -o "$tmp/prebuilt/bin/$b" "$engine_build/bin/$b"
  done
  for l in "$engine_build"/lib/libddp.so*; do
    if [[ -L $l ]]; then
      cp -P "$l" "$tmp/prebuilt/lib/"
    else
      strip -o "$tmp/prebuilt/lib/$(basename "$l")" "$l"
    fi
  done
  "$engine_build/bin/ddp-trainer" --version > "$tmp/prebuilt/VERSION" 2>/dev/null || true
  (cd "$engine_build" && grep -E '^(DDP_TORCH_PYTHON|CMAKE_BUILD_TYPE|DDP_REQUIRE_CUDA):' CMakeCache.txt \
     >> "$tmp/prebuilt/VERSION" 2>/dev/null) || true
  # The torch it was built against: run.sh builds there instead where the machine's differs.
  torch_py=$(sed -n 's/^DDP_TORCH_PYTHON:[A-Z]*=//p' "$engine_build/CMakeCache.txt" 2>/dev/null || true)
  if [[ -n $torch_py ]]; then
    echo "torch $("$torch_py" -c 'import torch; print(torch.__version__)' 2>/dev/null)" >> "$tmp/prebuilt/VERSION"
  fi
  tar -C "$tmp/prebuilt" -cf - VERSION bin lib | xz -T0 -6 > "$carry/prebuilt.tar.xz"
  echo "pack.sh: prebuilt.tar.xz: ${engine_bins[*]} and libddp.so from $engine_build" \
       "($(mib "$tmp/prebuilt") stripped): $(mib "$carry/prebuilt.tar.xz")"
fi

# The data of stack.py's trainer jobs, as Debian ships it.
fmnist_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz
              t10k-labels-idx1-ubyte.gz)
if ! ls "${fmnist_files[@]/#/$fmnist/}" >/dev/null 2>&1; then
  rm -rf "$carry/fashion-mnist"
  echo "pack.sh: no Fashion-MNIST in $fmnist (apt-get install dataset-fashion-mnist): left out"
else
  mkdir -p "$carry/fashion-mnist"
  cp "${fmnist_files[@]/#/$fmnist/}" "$carry/fashion-mnist/"
  echo "pack.sh: fashion-mnist: the 4 files of $fmnist: $(mib "$carry/fashion-mnist")"
fi

# llm.c: its source and train_gpt2cu built here (nvcc compiles for sm_90 without a GPU).
llmc_src=${DDP_LLMC_SRC:-}
if [[ -n $llmc_src ]]; then
  rm -rf "$carry/llm.c" && mkdir -p "$carry/llm.c/src"
  if git -C "$llmc_src" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$llmc_src" archive HEAD | tar -x -C "$carry/llm.c/src"
    echo "llm.c $(git -C "$llmc_src" rev-parse HEAD) ($llmc_src)" > "$carry/llm.c/VERSION"
  elif [[ -f $llmc_src/train_gpt2.cu ]]; then
    cp -a "$llmc_src"/. "$carry/llm.c/src/"
    rm -rf "$carry/llm.c/src/.git" "$carry/llm.c/src/build" "$carry/llm.c/src/train_gpt2cu"
    echo "llm.c source folder $llmc_src" > "$carry/llm.c/VERSION"
  else
    echo "pack.sh: DDP_LLMC_SRC=$llmc_src is neither a git clone nor llm.c's source" >&2
    exit 1
  fi
  # What the bench needs of it: train_gpt2.cu, llmc/, the Makefile and its licence.
  rm -rf "$carry/llm.c/src/dev" "$carry/llm.c/src/doc" "$carry/llm.c/src/.github"
  llmc_build=$tmp/llmc && mkdir -p "$llmc_build" && cp -a "$carry/llm.c/src"/. "$llmc_build/"
  if bash bench/gpu/llmc_build.sh "$llmc_build"; then
    cp "$llmc_build/train_gpt2cu" "$carry/llm.c/train_gpt2cu"
    echo "pack.sh: llm.c/: src ($(mib "$carry/llm.c/src")) and train_gpt2cu" \
         "($(mib "$carry/llm.c/train_gpt2cu")), $(cat "$carry/llm.c/VERSION")"
  else
    echo "pack.sh: llm.c did not build here: its source alone carried (run.sh builds it there)"
  fi
elif [[ -f $carry/llm.c/src/train_gpt2.cu ]]; then
  echo "pack.sh: llm.c/ kept as packed before ($(cat "$carry/llm.c/VERSION" 2>/dev/null)):" \
       "$(mib "$carry/llm.c")"
else
  echo "pack.sh: no DDP_LLMC_SRC (a clone of github.com/karpathy/llm.c): llm.c/ left out" \
       "(the GPT bench reports its side as not built)"
fi

# What a device call sends: tracked and untracked-not-ignored files, plus the carried folder.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
             xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
carry_bytes=$(du -sb "$carry" | cut -f1)
debs_bytes=$(du -sb "$carry/debs" | cut -f1)
total=$((tree_bytes + carry_bytes))
awk -v n="$debs" -v d="$debs_bytes" -v c="$carry_bytes" -v t="$tree_bytes" -v l="$limit_mib" 'BEGIN {
  printf "pack.sh: %d packages, %.1f MiB; .gpu-carry %.1f MiB in all; the working tree %.1f MiB; %.1f MiB of %d MiB\n",
         n, d / 1048576, c / 1048576, t / 1048576, (c + t) / 1048576, l }'
if (( total > limit_mib * 1048576 )); then
  echo "pack.sh: over the ${limit_mib} MiB a device call carries" >&2
  exit 1
fi
