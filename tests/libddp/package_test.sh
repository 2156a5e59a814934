#!/usr/bin/env bash
# libddp as an outside project meets it: `cmake --install` into a temporary prefix;
# the installed headers carry no private ones; pkg-config compiles and links a program;
# examples/cpp, copied out of the source tree, configures with find_package(ddp) and
# builds; and the built program runs as a command job on a real 2-worker cluster (the
# installed coordinator, workers and ddpctl on loopback) to SUCCEEDED, with both ranks'
# losses in `ddpctl watch`.
#   package_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > /dev/null
for f in include/ddp/ddp.h include/ddp/version.h lib/cmake/ddp/ddpConfig.cmake \
         lib/cmake/ddp/ddpConfigVersion.cmake lib/cmake/ddp/ddpTargets.cmake lib/pkgconfig/ddp.pc; do
  [ -f "$prefix/$f" ] || fail "$prefix/$f was not installed"
done
ls "$prefix"/lib/libddp.so.0.* > /dev/null || fail "no versioned libddp.so in $prefix/lib"
# Public headers include each other, LibTorch and the standard library only.
private=$(grep -h '^#include "' "$prefix"/include/ddp/*.h | grep -v '^#include "ddp/' || true)
[ -z "$private" ] || fail "installed headers include private ones: $private"
echo "ok: installed headers, library, CMake package and pkg-config file"

# pkg-config: a program that links libddp and reports its version.
cat > "$work/version.cc" <<'CC'
#include <ddp/ddp.h>
#include <cstdio>
#include <cstring>
int main() { std::printf("%s\n", ddp::version()); return std::strcmp(ddp::version(), DDP_VERSION_STRING); }
CC
# Both compiles go through ccache where there is one, with the temporary directory as its
# base: paths under it hash as relative ones, so a later run of this test hits the cache.
cc=()
if command -v ccache > /dev/null; then
  cc=(ccache)
  export CCACHE_BASEDIR=$work CCACHE_NOHASHDIR=true
fi
# shellcheck disable=SC2046
(cd "$work" && ${cc[@]+"${cc[@]}"} g++ -std=c++17 -c version.cc -o version.o \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags ddp))
# shellcheck disable=SC2046
g++ "$work/version.o" -o "$work/version" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --libs ddp) -Wl,-rpath,"$prefix/lib"
[ "$("$work/version")" = "$(grep -o 'project(ddp VERSION [0-9.]*' "$src/CMakeLists.txt" | cut -d' ' -f3)" ] ||
  fail "pkg-config program reports another version"
echo "ok: pkg-config builds and links a program"

# The example, outside the source tree, against the installed package only.
cp -r "$src/examples/cpp" "$work/example"
rm -rf "$work/example/build"
launcher=()
[ ${#cc[@]} -eq 0 ] || launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$work/example" -B "$work/example/build" -DCMAKE_PREFIX_PATH="$prefix" \
  ${launcher[@]+"${launcher[@]}"} > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$work/example/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }
program=$work/example/build/fashion_resnet
[ -x "$program" ] || fail "the example did not build"
echo "ok: examples/cpp builds with find_package(ddp) from $prefix"

# A real cluster from the installed binaries: a coordinator and two workers.
bin=$prefix/bin
# Ports of this test's own (tests/common/claim_ports.sh): the coordinator's, and the
# workers' store ports.
source "$src/tests/common/claim_ports.sh"
claim_port_block
export DDP_COORDINATOR=127.0.0.1:$port_block
mkdir -p "$work/logs"
"$bin/ddp-coordinator" --listen "$DDP_COORDINATOR" --state-dir "$work/state" > "$work/logs/coordinator.log" 2>&1 &
pids+=($!)
for w in node-a node-b; do
  "$bin/ddp-worker" --coordinator "$DDP_COORDINATOR" --name "$w" --slots 1 --cpus 1 \
    --store-ports "$((port_block + 1))-$((port_block + 15))" \
    --work-dir "$work/$w" > "$work/logs/$w.log" 2>&1 &
  pids+=($!)
done
alive=0
for _ in $(seq 1 300); do
  alive=$("$bin/ddpctl" workers -o json 2>/dev/null | grep -o '"alive":true' | wc -l || true)
  [ "$alive" -ge 2 ] && break
  sleep 0.1
done
[ "$alive" -ge 2 ] || { cat "$work"/logs/*.log; fail "the workers did not register"; }

cat > "$work/job.yaml" <<YAML
name: libddp-example
nodes: 2
nproc_per_node: 1
command: [$program, --data, /usr/share/datasets/fashion-mnist, --epochs, "1", --limit, "768",
          --threads, "1", --checkpoint-dir, $work/checkpoints]
YAML
set +e
"$bin/ddpctl" submit "$work/job.yaml" --watch > "$work/watch.txt" 2>&1
status=$?
set -e
job=$("$bin/ddpctl" list -o json | grep -o '"id":"[^"]*"' | head -1 | cut -d'"' -f4)
if [ "$status" -ne 0 ]; then
  cat "$work/watch.txt"
  "$bin/ddpctl" get "$job" || true
  "$bin/ddpctl" logs "$job" --rank 0 --tail 20 || true
  fail "ddpctl watch exited $status"
fi
"$bin/ddpctl" get "$job" -o json | grep -q '"state":"SUCCEEDED"' || fail "job $job did not succeed"
# Both ranks' losses reached watch (plain lines when piped).
for r in 0 1; do
  grep -Eq "rank $r epoch 0 step [0-9]+/[0-9]+ loss [0-9]+\.[0-9]+" "$work/watch.txt" ||
    { cat "$work/watch.txt"; fail "no loss of rank $r in ddpctl watch"; }
done
echo "ok: the example ran as command job $job on 2 workers to SUCCEEDED, both ranks' loss in watch"
echo "4 passed, 0 failed"
