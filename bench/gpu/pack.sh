#!/usr/bin/env bash
# Makes what the GPU check carries: the Debian 12 packages that bench/gpu/run.sh builds
# libddp and ddp-trainer from on a machine that has none of them (absl, yaml-cpp,
# GoogleTest, zlib), downloaded as .deb files into .gpu-carry/debs (git ignores it).
# Then checks that the repository's working tree and that folder, which a device call
# sends, stay under the 64 MiB it takes.
#
#   bash bench/gpu/pack.sh            # then, on the GPU machine: bash bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
limit_mib=64
pkgs=(libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 libgtest-dev libgmock-dev
      zlib1g-dev zlib1g)
carry=.gpu-carry
mkdir -p "$carry/debs"
rm -f "$carry"/debs/*.deb
# (As root, apt warns that _apt cannot write here and downloads unsandboxed: harmless.)
(cd "$carry/debs" && apt-get download "${pkgs[@]}" >/dev/null 2> >(grep -v unsandboxed >&2)) || {
  echo "pack.sh: apt-get download failed: run 'apt-get update' (Debian 12's archive must be reachable)" >&2
  exit 1
}
debs=$(ls "$carry"/debs/*.deb | wc -l)
if [[ $debs -ne ${#pkgs[@]} ]]; then
  echo "pack.sh: expected ${#pkgs[@]} .deb files, got $debs" >&2
  exit 1
fi
# What a device call sends: tracked and untracked-not-ignored files, plus the carried folder.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
             xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
carry_bytes=$(du -sb "$carry" | cut -f1)
total=$((tree_bytes + carry_bytes))
awk -v n="$debs" -v c="$carry_bytes" -v t="$tree_bytes" -v l="$limit_mib" 'BEGIN {
  printf "pack.sh: %d packages, %.1f MiB; the working tree %.1f MiB; %.1f MiB of %d MiB\n",
         n, c / 1048576, t / 1048576, (c + t) / 1048576, l }'
if (( total > limit_mib * 1048576 )); then
  echo "pack.sh: over the ${limit_mib} MiB a device call carries" >&2
  exit 1
fi
