#!/usr/bin/env bash
# libddp installed the way docs/library.md and the README tell a user to: a fresh
# build of the `ddp` target alone (no daemons built), then `cmake --install` with
# `--component libddp`, and the plain `cmake --install` of that same build too. Both
# lay out the headers, the library, the CMake package and ddp.pc, and a program
# compiled against the result through pkg-config runs.
#   install_component_test.sh SOURCE_DIR BUILD_TYPE C_COMPILER CXX_COMPILER
set -euo pipefail
src=$(cd "$1" && pwd)
type=$2
# The build's own compilers: the same commands as its, for ccache.
cc=$3 cxx=$4
# A sibling of build/ (same depth under the source tree), so that its compiles hit
# ccache (CMakeLists.txt: CCACHE_BASEDIR) instead of rebuilding the engine cold.
fresh=$(mktemp -d "$src/.install-test-build.XXXXXX")
work=$(mktemp -d)
trap 'rm -rf "$fresh" "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake -S "$src" -B "$fresh" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DDDP_BUILD_TESTS=OFF \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$fresh" --target ddp > "$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; fail "cmake --build --target ddp"; }
for p in ddp-coordinator ddp-worker ddp-trainer ddpctl; do
  [ ! -e "$fresh/bin/$p" ] || fail "building the ddp target built $p too"
done
echo "ok: a fresh build of the ddp target alone"

check_library() {  # PREFIX
  for f in include/ddp/ddp.h include/ddp/version.h lib/cmake/ddp/ddpConfig.cmake \
           lib/cmake/ddp/ddpConfigVersion.cmake lib/cmake/ddp/ddpTargets.cmake lib/pkgconfig/ddp.pc; do
    [ -f "$1/$f" ] || fail "$1/$f was not installed"
  done
  ls "$1"/lib/libddp.so.0.* > /dev/null || fail "no versioned libddp.so in $1/lib"
}

cmake --install "$fresh" --component libddp --prefix "$work/component" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install --component libddp"; }
check_library "$work/component"
[ ! -e "$work/component/bin" ] || fail "--component libddp installed bin/: $(ls "$work/component/bin")"
[ ! -e "$work/component/share/ddp" ] || fail "--component libddp installed share/ddp"
echo "ok: cmake --install --component libddp lays out the library alone"

# The plain install of the same build: what the issue's user ran. It installs the
# library and skips the programs that were not built, instead of failing half-way.
cmake --install "$fresh" --prefix "$work/plain" > "$work/install-plain.log" 2>&1 ||
  { cat "$work/install-plain.log"; fail "plain cmake --install of a build of ddp alone"; }
check_library "$work/plain"
[ ! -e "$work/plain/bin/ddp-coordinator" ] || fail "a program that was never built was installed"
echo "ok: the plain cmake --install of that build installs the library"

cat > "$work/version.cc" <<'CC'
#include <ddp/ddp.h>
#include <cstdio>
#include <cstring>
int main() { std::printf("%s\n", ddp::version()); return std::strcmp(ddp::version(), DDP_VERSION_STRING); }
CC
# shellcheck disable=SC2046
g++ -std=c++17 "$work/version.cc" -o "$work/version" \
  $(PKG_CONFIG_PATH="$work/component/lib/pkgconfig" pkg-config --cflags --libs ddp) \
  -Wl,-rpath,"$work/component/lib"
"$work/version" > /dev/null || fail "the program built on the installed library does not run"
echo "ok: a program compiles, links and runs against the component's install"
