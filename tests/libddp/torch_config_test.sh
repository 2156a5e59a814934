#!/usr/bin/env bash
# A bad torch install gets CMake's message naming the fix (cmake/Torch.cmake), never a
# compiler error: no venv, a torch that does not import, another version, a CPU-only
# wheel where CUDA is required, Debian's LibTorch where CUDA is required, and one
# LibTorch's package with another's libraries. The interpreters here are stand-ins
# that print what a venv's python would (this test checks CMake's checks, not torch).
#   torch_config_test.sh SOURCE_DIR [VENV_PYTHON]
set -euo pipefail
src=$(cd "$1" && pwd)
venv_python=${2:-$src/.venv-torch2/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$work/bin  # The stand-in interpreters; the build dirs are beside it.
mkdir "$bin"
fail() { echo "FAIL: $*"; exit 1; }
n=0

# configure NAME EXPECTED-TEXT CMAKE-ARGS...: the configure must fail, saying EXPECTED-TEXT.
expect_refusal() {
  local name=$1 want=$2
  shift 2
  if cmake -S "$src" -B "$work/$name" -G Ninja -DDDP_BUILD_TESTS=OFF "$@" > "$work/$name.log" 2>&1; then
    fail "$name: configure succeeded; expected: $want"
  fi
  # CMake folds long messages: compare with the line breaks and indents taken out.
  tr -s ' \n' ' ' < "$work/$name.log" | grep -qF -- "$want" ||
    { cat "$work/$name.log"; fail "$name: the error does not say: $want"; }
  echo "ok: $name: $want"
  n=$((n + 1))
}

# A stand-in interpreter: prints VERSION, CUDA, prefix and lib dir as torch would.
fake_python() {  # NAME VERSION CUDA
  cat > "$bin/$1" <<SH
#!/bin/sh
printf '%s\n%s\n%s\n%s\n' '$2' '$3' '$work/no-such-prefix' '$work/no-such-lib'
SH
  chmod +x "$bin/$1"
  echo "$bin/$1"
}

expect_refusal no-venv "no such interpreter (no venv there?): run scripts/install_torch2.sh" \
  -DDDP_TORCH_PYTHON="$work/missing/bin/python"

cat > "$bin/no-torch" <<'SH'
#!/bin/sh
echo "ModuleNotFoundError: No module named 'torch'" >&2
exit 1
SH
chmod +x "$bin/no-torch"
expect_refusal no-torch "cannot import torch: ModuleNotFoundError: No module named 'torch'" \
  -DDDP_TORCH_PYTHON="$bin/no-torch"

expect_refusal wrong-version "has torch 2.10.1+cu130, and this build expects 2.11.0: rerun scripts/install_torch2.sh" \
  -DDDP_TORCH_PYTHON="$(fake_python old 2.10.1+cu130 13.0)"

expect_refusal cpu-wheel "is a CPU-only wheel (torch.version.cuda is None), and DDP_REQUIRE_CUDA is on" \
  -DDDP_TORCH_PYTHON="$(fake_python cpu 2.11.0+cpu '')" -DDDP_REQUIRE_CUDA=ON

expect_refusal debian-cpu "is a CPU build, so the NCCL path would not be compiled" -DDDP_REQUIRE_CUDA=ON

if [ -x "$venv_python" ]; then
  prefix=$("$venv_python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  expect_refusal mixed "belongs to another LibTorch (Debian's libtorch-dev?): configure a fresh build dir with -DCMAKE_LIBRARY_PATH=" \
    -DCMAKE_PREFIX_PATH="$prefix"
else
  echo "skipped: mixed LibTorch libraries (no venv at $venv_python: scripts/install_torch2.sh makes it)"
fi
echo "ok: $n bad torch installs refused with their fix"
