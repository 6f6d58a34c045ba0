#!/usr/bin/env bash
# Compares the decode plans of the working tree with those of git revision REV
# (default HEAD) on ~166k inputs (shapes, formats, layouts, SM counts, device
# shared-memory limits), without a GPU: scripts/plan_table.cpp is compiled with
# the host C++ compiler against each tree's csrc/plan and the outputs are
# diffed. Run it after any change to csrc/plan to know which calls it moves.
#   scripts/plan_compare.sh [REV]      exit 0: identical, 1: plans differ (diff shown)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
CXX=${CXX:-c++}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/old" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach -q "$tmp/old" "$rev"
[ -f "$tmp/old/csrc/plan/plan.cpp" ] || { echo "plan_compare: $rev has no csrc/plan (older layout)"; exit 2; }
for side in old new; do
  root=$([ "$side" = old ] && echo "$tmp/old" || pwd)
  "$CXX" -std=c++17 -O1 -I "$root/csrc" scripts/plan_table.cpp "$root/csrc/plan/plan.cpp" -o "$tmp/plan_$side"
  "$tmp/plan_$side" > "$tmp/$side.txt" 2>/dev/null
done
if cmp -s "$tmp/old.txt" "$tmp/new.txt"; then
  echo "plan_compare: identical to $rev on $(wc -l < "$tmp/new.txt") inputs"
else
  echo "plan_compare: plans differ from $rev ($(diff "$tmp/old.txt" "$tmp/new.txt" | grep -c '^>') of $(wc -l < "$tmp/new.txt") inputs):"
  diff "$tmp/old.txt" "$tmp/new.txt" | head -${PLAN_DIFF_LINES:-40}
  exit 1
fi
