#!/usr/bin/env bash
# Installs PyPI's torch 2.11.0 (the CUDA build: PyPI's default Linux x86_64 wheel, with
# CUDA, cuDNN and NCCL in its nvidia-* dependency wheels) into a virtual environment,
# for building ddp against LibTorch 2.x as a second flavour beside Debian's CPU 1.13:
#
#   scripts/install_torch2.sh
#   cmake -S . -B build-torch2 -G Ninja -DDDP_TORCH_PYTHON=$PWD/.venv-torch2/bin/python
#
# cmake/Torch.cmake asks that interpreter where torch's CMake package and libraries are,
# checks the version (and CUDA, with -DDDP_REQUIRE_CUDA=ON), and puts torch's lib/ first,
# so that Debian's libc10.so 1.13 is not picked beside torch 2.11's headers.
#
# Idempotent: the venv is created once and reused; pip leaves a satisfied torch alone.
#
# Environment:
#   DDP_TORCH2_VENV    where the venv goes (default: <repo>/.venv-torch2)
#   DDP_TORCH2_PYTHON  the interpreter that creates it (default: python3; >= 3.10 is
#                      checked up front, pip has the final word on which have wheels)
#   DDP_TORCH2_WHEELS  a folder of already-downloaded wheels (default: none): a torch
#                      wheel of the pinned version there that fits is installed from it, a
#                      speed-up only; PyPI supplies everything else (and torch, without one)
#   PIP_INDEX_URL etc. honoured by pip as usual
set -euo pipefail

torch_version=2.11.0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DDP_TORCH2_VENV:-$here/.venv-torch2}
python=${DDP_TORCH2_PYTHON:-python3}
wheels=${DDP_TORCH2_WHEELS:-}

die() { echo "install_torch2.sh: error: $*" >&2; exit 1; }
log() { echo "install_torch2.sh: $*"; }

command -v "$python" >/dev/null 2>&1 ||
  die "no '$python' on PATH; install Python >= 3.10 or point DDP_TORCH2_PYTHON at one"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' ||
  die "$("$python" -V 2>&1) is too old: torch $torch_version needs Python >= 3.10;" \
      "point DDP_TORCH2_PYTHON at a newer interpreter"

# 1. The venv (recreated when a previous one is broken, e.g. its interpreter was removed).
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
  log "reusing the venv at $venv ($("$venv/bin/python" -V 2>&1))"
else
  if [ -e "$venv" ]; then
    log "the venv at $venv is broken; recreating it"
    rm -rf "$venv"
  fi
  log "creating a venv at $venv with $("$python" -V 2>&1)"
  "$python" -m venv "$venv" ||
    die "could not create a venv at $venv (on Debian: apt-get install python3-venv)"
fi
vpy=$venv/bin/python

# 2. torch (pinned) and numpy. The local wheel folder only saves the big download.
# pip, given the same version both as a --find-links file and on the index, downloads
# the index's copy; so a local wheel that fits this venv's Python and machine is passed
# by path (pip still checks its tags, and fetches its dependencies from PyPI).
torch_req="torch==$torch_version"
pytag=cp$("$vpy" -c 'import sys; print("%d%d" % sys.version_info[:2])')
if [ -n "$wheels" ] && [ -d "$wheels" ]; then
  for whl in "$wheels"/torch-"$torch_version"-"$pytag"-"$pytag"-*linux*_"$(uname -m)".whl; do
    if [ -f "$whl" ]; then
      log "using the local wheel $whl (dependencies from PyPI)"
      torch_req="torch @ file://$whl"
      break
    fi
  done
fi
# numpy and PyYAML: the reference scripts (scripts/gen_fixtures.py) run in the venv too.
pip_args=(install --disable-pip-version-check --no-input "$torch_req" numpy pyyaml)
log "pip ${pip_args[*]}"
source "$here/scripts/venv_pip.sh"
venv_pip "$vpy" "${pip_args[@]}" ||
  die "pip could not install torch==$torch_version (see pip's message above). Check that" \
      "PyPI is reachable (or PIP_INDEX_URL points at a mirror that has torch $torch_version)" \
      "and that PyPI has a torch $torch_version wheel for $("$vpy" -V 2>&1) on Linux $(uname -m)" \
      "(pip download torch==$torch_version --no-deps says); if not, point" \
      "DDP_TORCH2_PYTHON at a Python it has one for, remove $venv and rerun"

# 3. Is it the torch ddp's torch-2 flavour expects?
info=$("$vpy" - <<'EOF'
import os, torch, torch.utils
print("version=" + torch.__version__)
print("cuda=" + (torch.version.cuda or ""))
print("prefix=" + torch.utils.cmake_prefix_path)
print("libdir=" + os.path.join(os.path.dirname(torch.__file__), "lib"))
print("cxx11abi=" + str(int(torch.compiled_with_cxx11_abi())))
try:
    print("cudnn=" + str(torch.backends.cudnn.version()))
except Exception as e:  # Without a GPU this still loads libcudnn; report, do not fail.
    print("cudnn=unknown (%s)" % e)
try:
    print("nccl=" + ".".join(map(str, torch.cuda.nccl.version())))
except Exception as e:
    print("nccl=unknown (%s)" % e)
print("distributed=" + str(int(torch.distributed.is_available())))
print("gpus=" + str(torch.cuda.device_count()))
EOF
) || die "'import torch' fails in $venv (see the traceback above); remove $venv and rerun"
get() { sed -n "s/^$1=//p" <<<"$info"; }

version=$(get version)  # 2.11.0+cu130: PyPI's CUDA wheel carries a local version label.
[ "${version%%+*}" = "$torch_version" ] ||
  die "the venv has torch $version, not $torch_version. Remove $venv (or run" \
      "'$vpy -m pip install torch==$torch_version') and rerun this script"
[ -n "$(get cuda)" ] ||
  die "torch $version in $venv is a CPU-only wheel (torch.version.cuda is None); the CUDA" \
      "flavour needs PyPI's default torch $torch_version wheel, not one from a CPU-only" \
      "index. Remove $venv, unset PIP_INDEX_URL/PIP_EXTRA_INDEX_URL if they point at one," \
      "and rerun"
[ "$(get distributed)" = 1 ] || die "torch $version in $venv was built without torch.distributed (c10d)"

log "torch $version, CUDA $(get cuda), cuDNN $(get cudnn), NCCL $(get nccl)," \
    "CXX11 ABI $(get cxx11abi), GPUs visible: $(get gpus)"
log "venv: $venv ($(du -sh "$venv" 2>/dev/null | cut -f1))"
log "configure with: cmake -S $here -B $here/build-torch2 -G Ninja -DDDP_TORCH_PYTHON=$vpy"
log "cmake prefix path (also the last line of this output, alone):"
get prefix
