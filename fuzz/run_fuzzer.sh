#!/usr/bin/env bash
# Runs one libFuzzer target for a fixed number of inputs, starting from its seed corpus
# in the repository. New inputs go to a scratch corpus (the seeds are never written);
# a crashing input is kept as ${TMPDIR:-/tmp}/ddp-fuzz-<target>-crash-* and the run
# fails.
#   fuzz/run_fuzzer.sh BINARY SEED_DIR RUNS [extra libFuzzer flags...]
set -euo pipefail
bin=$1 seeds=$2 runs=$3
shift 3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/corpus"
exec "$bin" -runs="$runs" -seed=1 -max_len=8192 -timeout=30 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="${TMPDIR:-/tmp}/ddp-fuzz-$(basename "$bin")-" \
  "$@" "$scratch/corpus" "$seeds"
