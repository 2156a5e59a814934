#!/usr/bin/env bash
# Installs the readers the tests check ddp's exports against, from PyPI, into a virtual
# environment of their own (.venv-tools): TensorBoard (its EventAccumulator reads what
# `ddpctl tensorboard` writes). scripts/run_tests.sh runs this before building; CMake's
# DDP_TOOLS_PYTHON points the tests at the venv's interpreter.
#
# Idempotent: the venv is made once and pip leaves satisfied pins alone.
#   DDP_TOOLS_VENV    where the venv goes (default: <repo>/.venv-tools)
#   DDP_TOOLS_PYTHON  the interpreter that makes it (default: python3, >= 3.9)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DDP_TOOLS_VENV:-$here/.venv-tools}
python=${DDP_TOOLS_PYTHON:-python3}
tensorboard_version=2.20.0

die() { echo "install_test_tools.sh: error: $*" >&2; exit 1; }
command -v "$python" > /dev/null 2>&1 || die "no '$python' on PATH (set DDP_TOOLS_PYTHON)"
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' > /dev/null 2>&1; }; then
  rm -rf "$venv"
  "$python" -m venv "$venv" ||
    die "could not create a venv at $venv (on Debian: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "tensorboard==$tensorboard_version" ||
  die "pip could not install tensorboard==$tensorboard_version into $venv (is PyPI reachable?)"
"$venv/bin/python" -c 'import tensorboard; print("install_test_tools.sh: tensorboard", tensorboard.__version__, "in '"$venv"'")'
