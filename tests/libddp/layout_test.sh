#!/usr/bin/env bash
# The engine's home (docs/decisions/libddp.md, decision 139), held against the tree:
#   - nothing outside libddp/ includes libddp/src/ (the API's implementation) but its
#     bridge to the engine, libddp/src/api_bridge.h;
#   - nothing in common/ includes a public ddp/ header (common/ is below libddp);
#   - worker/ holds the agent alone;
#   - the built-in trainer (trainer/) includes libddp's public headers, its one
#     internal target's (libddp/engine/) and the bridge, nothing else of libddp;
#   - the engine (libddp/engine/) includes nothing of the trainer (trainer/) nor of
#     job.yaml's parser (common/jobspec/): the library is below its first client, and
#     trainer/engine_options.h maps a JobSpec onto the engine's options;
#   - each torch-free contract type is defined once, in common/contract/, with no alias.
# The checker is first run on made-up trees that break each rule, so it is known to
# catch what it looks for.
#
#   bash tests/libddp/layout_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "${1:?usage: layout_test.sh SOURCE_DIR}" && pwd)

# Prints each violation of `root`; returns 1 if there is one.
check_tree() {
  local root=$1 bad=0 hits
  cd "$root"
  local code=(--include='*.h' --include='*.cc' --include='*.h.in' --include='*.cpp')
  local dirs=()
  for d in common worker trainer libddp coordinator client bench fuzz tests examples; do
    [[ -d $d ]] && dirs+=("$d")
  done
  if hits=$(grep -rn "${code[@]}" -E '#include\s*[<"]libddp/src/' "${dirs[@]}" | grep -v '^libddp/' |
             grep -v -E '#include\s*[<"]libddp/src/api_bridge\.h[>"]'); then
    echo "libddp/src/ included from outside libddp/:"; echo "$hits"; bad=1
  fi
  # (ddp/v1/ is the generated protobuf messages', not libddp's.)
  if [[ -d common ]] && hits=$(grep -rn "${code[@]}" -E '#include\s*[<"]ddp/' common |
                               grep -v -E '#include\s*[<"]ddp/v1/'); then
    echo "common/ includes a public ddp/ header:"; echo "$hits"; bad=1
  fi
  if [[ -d worker ]]; then
    local other
    other=$(find worker -mindepth 1 -maxdepth 1 ! -name agent -printf '%p\n')
    if [[ -n $other ]]; then echo "worker/ holds more than the agent:"; echo "$other"; bad=1; fi
  fi
  if [[ -d trainer ]] && hits=$(grep -rn "${code[@]}" -E '#include\s*[<"]libddp/' trainer |
                                grep -v -E '#include\s*[<"]libddp/(engine/|src/api_bridge\.h[>"])'); then
    echo "trainer/ includes libddp beyond its public headers and libddp/engine/:"; echo "$hits"; bad=1
  fi
  if [[ -d libddp/engine ]] && hits=$(grep -rn "${code[@]}" -E '#include\s*[<"]trainer/' libddp/engine); then
    echo "libddp/engine/ includes trainer/:"; echo "$hits"; bad=1
  fi
  if [[ -d libddp/engine ]] &&
     hits=$(grep -rn "${code[@]}" -E '#include\s*[<"]common/jobspec/' libddp/engine); then
    echo "libddp/engine/ includes common/jobspec/:"; echo "$hits"; bad=1
  fi
  local type
  for type in Environment Position LrSchedule OptimizerSpec; do
    hits=$(grep -rn "${code[@]}" -E "^\s*struct ${type}\s*\{" "${dirs[@]}" || true)
    if [[ $(grep -c . <<<"$hits") -ne 1 || $hits != common/contract/* ]]; then
      echo "struct ${type} must be defined once, in common/contract/; found:"; echo "${hits:-none}"
      bad=1
    fi
    if hits=$(grep -rn "${code[@]}" -E "using\s+\w+\s*=\s*(ddp::)?${type}\s*;" "${dirs[@]}"); then
      echo "an alias of ${type} (one name per concept):"; echo "$hits"; bad=1
    fi
  done
  return $bad
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A tree that keeps every rule, then one broken copy of it per rule.
good=$tmp/good
mkdir -p $good/common/contract $good/worker/agent $good/trainer $good/libddp/src $good/libddp/engine
for type in Environment Position LrSchedule OptimizerSpec; do
  printf 'namespace ddp {\nstruct %s {\n};\n}\n' $type > $good/common/contract/$type.h
done
printf '#include "ddp/process_group.h"\n#include "libddp/src/api_bridge.h"\n' > $good/trainer/t.cc
printf '#include "libddp/engine/comm.h"\n' >> $good/trainer/t.cc
printf '#include "libddp/src/x.h"\n' > $good/libddp/src/y.cc
(check_tree $good) || { echo "FAIL: the made-up good tree was refused"; exit 1; }

expect_refused() {  # name, then a command that breaks a copy of the good tree in $PWD
  local name=$1; shift
  rm -rf $tmp/bad && cp -r $good $tmp/bad
  (cd $tmp/bad && "$@")
  if out=$(check_tree $tmp/bad); then echo "FAIL: not caught: $name"; exit 1; fi
  echo "caught ($name): $(head -1 <<<"$out")"
}
expect_refused "trainer includes libddp/src" \
  sh -c 'printf "#include \"libddp/src/internal.h\"\n" >> trainer/t.cc'
expect_refused "the engine includes common/jobspec/" \
  sh -c 'printf "#include \"common/jobspec/job_spec.h\"\n" > libddp/engine/optimizer.h'
expect_refused "a test includes libddp/src beyond the bridge" \
  sh -c 'mkdir -p tests && printf "#include \"libddp/src/join_impl.h\"\n" > tests/t.cc'
expect_refused "the engine includes trainer/" \
  sh -c 'printf "#include \"trainer/model.h\"\n" > libddp/engine/checkpoint.h'
expect_refused "common includes <ddp/...>" \
  sh -c 'printf "#include <ddp/lr_schedule.h>\n" > common/j.h'
expect_refused "worker holds the trainer" mkdir worker/trainer
printf '#include "ddp/v1/types.pb.h"\n' > $good/common/rpc.h  # Protobuf's ddp/v1 is fine.
(check_tree $good) || { echo "FAIL: ddp/v1/ refused"; exit 1; }
expect_refused "a second definition" \
  sh -c 'printf "struct Position {\n};\n" > libddp/engine/p.h'
expect_refused "an alias" sh -c 'printf "using TorchrunEnv = Environment;\n" > libddp/engine/e.h'

# The project itself.
if ! out=$(check_tree "$src"); then echo "$out"; echo "FAIL: the tree breaks the layout"; exit 1; fi
echo "PASS: the layout holds in $src"
