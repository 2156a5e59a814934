#!/usr/bin/env bash
# Installs the readers the tests check ddp's exports against, from PyPI, into a virtual
# environment of their own (.venv-tools): TensorBoard (its EventAccumulator reads what
# `ddpctl tensorboard` writes); MLflow (a real tracking server for the coordinator's
# --mlflow-uri, and its client to read runs back); the Python client (python/:
# `pip install ./python`, its stubs generated from proto/ at build time) and what its
# notebook test runs the notebook with (nbclient, nbformat, ipykernel, matplotlib,
# pandas); py-spy, with which the workers of the diagnosis test take Python ranks'
# stacks (ddp-worker --py-spy).
# scripts/run_tests.sh runs this before building; CMake's DDP_TOOLS_PYTHON points the
# tests at the venv's interpreter.
#
# Idempotent: the venv is made once and pip leaves satisfied pins alone; the client is
# reinstalled from the checkout each run (a few seconds), so its tests see its sources.
#   DDP_TOOLS_VENV    where the venv goes (default: <repo>/.venv-tools)
#   DDP_TOOLS_PYTHON  the interpreter that makes it (default: python3, >= 3.9)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DDP_TOOLS_VENV:-$here/.venv-tools}
python=${DDP_TOOLS_PYTHON:-python3}
tensorboard_version=2.20.0
# The notebook test's tools (wheels for Python 3.11), and grpcio-tools for the client's
# build (the version python/pyproject.toml requires).
notebook_pins=(nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 matplotlib==3.11.2
               pandas==3.1.1 grpcio-tools==1.85.1 setuptools==84.2.1)
# A real MLflow tracking server and its client, which the MLflow test reads runs with.
mlflow_version=3.17.2
py_spy_version=0.4.3

die() { echo "install_test_tools.sh: error: $*" >&2; exit 1; }
command -v "$python" > /dev/null 2>&1 || die "no '$python' on PATH (set DDP_TOOLS_PYTHON)"
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' > /dev/null 2>&1; }; then
  rm -rf "$venv"
  "$python" -m venv "$venv" ||
    die "could not create a venv at $venv (on Debian: apt-get install python3-venv)"
fi
source "$here/scripts/venv_pip.sh"
venv_pip "$venv/bin/python" install --quiet --disable-pip-version-check \
  "tensorboard==$tensorboard_version" ||
  die "pip could not install tensorboard==$tensorboard_version into $venv (is PyPI reachable?)"
venv_pip "$venv/bin/python" install --quiet --disable-pip-version-check "${notebook_pins[@]}" ||
  die "pip could not install ${notebook_pins[*]} into $venv (is PyPI reachable?)"
venv_pip "$venv/bin/python" install --quiet --disable-pip-version-check "mlflow==$mlflow_version" ||
  die "pip could not install mlflow==$mlflow_version into $venv (is PyPI reachable?)"
venv_pip "$venv/bin/python" install --quiet --disable-pip-version-check "py-spy==$py_spy_version" ||
  die "pip could not install py-spy==$py_spy_version into $venv (is PyPI reachable?)"
# Not editable: the tests import the package as users get it. --no-build-isolation
# builds with the venv's own pinned grpcio-tools (no download per run); --no-deps: its
# runtime dependencies (grpcio, protobuf) are already there.
venv_pip "$venv/bin/python" install --quiet --disable-pip-version-check --force-reinstall \
  --no-deps --no-build-isolation "$here/python" ||
  die "pip could not build and install the Python client from $here/python"
rm -rf "$here/python/build" "$here/python/ddp_client.egg-info"
"$venv/bin/python" -c 'import tensorboard; print("install_test_tools.sh: tensorboard", tensorboard.__version__, "in '"$venv"'")'
"$venv/bin/python" -c 'import ddp_client, nbclient, pandas, matplotlib, mlflow; print("install_test_tools.sh: ddp_client", ddp_client.__version__, "mlflow", mlflow.__version__, "nbclient", nbclient.__version__, "pandas", pandas.__version__, "matplotlib", matplotlib.__version__)'
