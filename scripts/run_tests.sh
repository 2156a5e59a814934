#!/usr/bin/env bash
# The README's test command: installs what the build needs (Debian 12 packages),
# builds everything from scratch into build/ (and, with clang, the fuzz targets into
# build/fuzz), and runs every test with ctest, a fixed-iteration run of each fuzz
# target included.
#   scripts/run_tests.sh [ctest args...]     e.g. -L unit, -R trainer, -L fuzz
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_FUZZ=ON
cmake --build build -j "$(nproc)"
cd build
ctest --output-on-failure --timeout 1200 "$@"
