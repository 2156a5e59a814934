#!/usr/bin/env bash
# The compiler arguments for configuring BUILD_DIR (decision 183, docs/decisions/build.md):
# clang (installed by scripts/install_deps.sh, for the fuzz targets too) for a new build
# dir, where one precompiled LibTorch serves every program (cmake/Pch.cmake); nothing
# for a build dir already configured (it keeps its compiler: another one would make
# CMake drop its cache) or when the caller chose one (CC or CXX set).
#   cmake -S . -B build $(bash scripts/cmake_compiler.sh build) ...
set -euo pipefail
build=$1
if [ -n "${CC:-}${CXX:-}" ] || [ -e "$build/CMakeCache.txt" ]; then
  exit 0
fi
if command -v clang++ > /dev/null && command -v clang > /dev/null; then
  echo "-DCMAKE_C_COMPILER=$(command -v clang) -DCMAKE_CXX_COMPILER=$(command -v clang++)"
fi
