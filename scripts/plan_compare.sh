#!/usr/bin/env bash
# Compares the split plans of the working tree with those of git revision REV
# (default HEAD) on ~166k inputs (shapes, formats, layouts, SM counts, device
# shared-memory limits), without a GPU: scripts/plan_harness/plan_table.cu is
# compiled by nvcc against each tree's csrc/ and the outputs are diffed.
# Use it after any change to csrc/cuda/decode_launch.cu or decode_smem.h to
# know whether a timing change can come from the plan. The Hopper wide and
# narrow kernels are modelled for the 132-SM, 227 KB inputs (see the harness's
# header); revisions from session 11 on (the harness needs the narrow kernel).
#   scripts/plan_compare.sh [REV]      exit 0: identical, 1: plans differ (diff shown)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/old" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach -q "$tmp/old" "$rev"
for side in old new; do
  root=$([ "$side" = old ] && echo "$tmp/old" || pwd)
  "$NVCC" -std=c++17 -I "$root/csrc" scripts/plan_harness/plan_table.cu -o "$tmp/plan_$side"
  "$tmp/plan_$side" > "$tmp/$side.txt" 2>/dev/null
done
if cmp -s "$tmp/old.txt" "$tmp/new.txt"; then
  echo "plan_compare: identical to $rev on $(wc -l < "$tmp/new.txt") inputs"
else
  echo "plan_compare: plans differ from $rev ($(diff "$tmp/old.txt" "$tmp/new.txt" | grep -c '^>') of $(wc -l < "$tmp/new.txt") inputs):"
  diff "$tmp/old.txt" "$tmp/new.txt" | head -40
  exit 1
fi
