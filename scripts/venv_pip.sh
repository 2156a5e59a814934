# Sourced by the scripts that fill virtual environments (install_torch2.sh,
# install_test_tools.sh): venv_pip VENV_PYTHON ARGS... is `VENV_PYTHON -m pip ARGS...`,
# done by uv (PyPI's `uv`, pinned, in <repo>/.venv-uv, installed by pip on first use)
# where it can be had: it downloads in parallel and installs from its cache
# (~/.cache/uv) by hard links, so a fresh clone's 5 GB torch venv takes seconds instead
# of the minutes pip spends unpacking it again. DDP_NO_UV=1 (or uv failing to install)
# uses pip itself. Only `install` is passed to uv; pip's flags that uv spells otherwise
# are translated: --force-reinstall (uv's --reinstall), --quiet, --no-input and
# --disable-pip-version-check (uv has neither prompt nor self-check).
ddp_uv_version=0.13.9
ddp_uv=""
venv_pip_uv() {  # Sets ddp_uv to uv's path, installing it the first time; 1 when not had.
  [ -z "${DDP_NO_UV:-}" ] || return 1
  [ -z "$ddp_uv" ] || return 0
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${DDP_UV_VENV:-$root/.venv-uv}
  local have=""
  [ ! -x "$venv/bin/uv" ] || have=$("$venv/bin/uv" --version 2>/dev/null || true)
  if [ "${have%% (*}" != "uv $ddp_uv_version" ]; then  # "uv 0.13.9 (hash date)"
    rm -rf "$venv"
    python3 -m venv "$venv" >/dev/null 2>&1 &&
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "uv==$ddp_uv_version" >/dev/null 2>&1 || {
      echo "venv_pip.sh: could not install uv==$ddp_uv_version with pip: pip installs instead" >&2
      rm -rf "$venv"
      return 1
    }
  fi
  ddp_uv=$venv/bin/uv
}
venv_pip() {  # venv_pip VENV_PYTHON install ARGS...
  local py=$1
  shift
  if [ "${1:-}" = install ] && venv_pip_uv; then
    shift
    local args=() a
    for a in "$@"; do
      case $a in
        --force-reinstall) args+=(--reinstall) ;;
        --disable-pip-version-check|--no-input) ;;
        *) args+=("$a") ;;
      esac
    done
    "$ddp_uv" pip install --python "$py" "${args[@]}"
  else
    "$py" -m pip "$@"
  fi
}
