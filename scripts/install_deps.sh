#!/usr/bin/env bash
# Installs every Debian 12 package ddp needs to build, test and run, and extracts the
# breast-cancer CSV (shipped inside python3-sklearn) into data/. Idempotent: packages
# already present are not reinstalled and `apt-get update` runs at most once per call,
# only when something is missing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev              # LibTorch 1.13 CPU with c10d + Gloo
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libsqlite3-dev zlib1g-dev
  libsystemd-dev                        # sd_notify readiness (Type=notify units)
  libcairo2-dev fonts-dejavu-core       # ddpctl plot's PNG and SVG pictures, and their font
  systemd zsh                           # tests: systemd-analyze verify, zsh completion
  prometheus-cpp-dev                    # the daemons' /metrics endpoints
  libboost-dev                          # the coordinator's web dashboard (--http-listen): Beast, Asio
  chromium chromium-driver python3-selenium   # tests: the dashboard in headless Chromium
  libnss3-tools                         # tests: certutil, so Chromium trusts the test CA
  prometheus                            # tests: a real Prometheus scrapes them; promtool
  libgtest-dev libgmock-dev googletest
  openssl libssl-dev                    # TLS file checks, token digests, scripts/make_certs.sh
  clang libclang-rt-14-dev              # libFuzzer + ASan/UBSan for the fuzz targets
  python3 python3-torch python3-yaml    # reference fixtures and the PyTorch benchmark
  slurmctld slurmd slurm-client munge  # tests: deploy/slurm against a real one-node Slurm
  dataset-fashion-mnist
  iptables libnetfilter-queue-dev       # tests/multihost: cuts, and slow links (ddp-test-netem)
  postgresql libpq-dev                  # the coordinator's PostgreSQL store (--store), and a real server in tests
  libcurl4-openssl-dev                  # the coordinator's MLflow client (--mlflow-uri)
  elfutils                              # eu-stack: the worker takes ranks' native stacks
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

# The deployment tests render deploy/kubernetes with `kubectl kustomize`; any kubectl
# will do, Debian's kubernetes-client when there is none.
if ! command -v kubectl >/dev/null 2>&1; then packages+=(kubernetes-client); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

updated=0
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -q
  updated=1
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# breast_cancer.csv ships inside python3-sklearn; we only need the file, not scipy & co.
csv="$here/data/breast_cancer.csv"
if [ ! -s "$csv" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && apt-get download python3-sklearn >/dev/null 2>&1); then
    [ "$updated" -eq 1 ] || "${sudo_cmd[@]}" apt-get update -q
    (cd "$tmp" && apt-get download python3-sklearn)
  fi
  dpkg -x "$tmp"/python3-sklearn_*.deb "$tmp/x"
  mkdir -p "$here/data"
  cp "$tmp/x/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv" "$csv.tmp"
  mv "$csv.tmp" "$csv"
  echo "install_deps: extracted $csv"
fi
