#!/usr/bin/env bash
# A/B of the working tree against a git revision on the device, in one call:
# both trees built side by side, then one command run in each in turn, round
# after round, so that a drift of the GPU's state (clocks, power cap) reaches
# both sides alike. A figure from another process or another day is not a
# ratio; this is how two builds are compared.
#
#   here:       scripts/ab_trees.sh prepare REV
#                 writes REV's tracked files to .peers/ab_base (git-ignored;
#                 the device's copy of .git can be stale, so the tree travels)
#   the device: run(command="scripts/ab_trees.sh run 3 'python3 scripts/split_sweep.py fp8 --graph --heads 128'",
#                   carry=[".peers/ab_base"])
#                 builds both trees (MAX_JOBS=8 each, in parallel), then runs
#                 the command 3 rounds, new then base, each in its own tree
#                 (PYTHONPATH and the working directory switched), every line
#                 of its output prefixed "new rN " or "base rN "; the output
#                 and both build logs go to $OUT (ab.txt, build_new.log,
#                 build_base.log).
# Environment: TORCH_CUDA_ARCH_LIST (default 9.0a), AB_TIMEOUT_S (each
# command's limit, default 120), AB_BASE (the base tree's folder, default
# .peers/ab_base).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=${AB_BASE:-$ROOT/.peers/ab_base}
case ${1:-} in
  prepare)
    rev=${2:?"usage: scripts/ab_trees.sh prepare REV"}
    git rev-parse --verify -q "$rev^{commit}" > /dev/null || { echo "ab_trees: '$rev' is not a commit"; exit 2; }
    rm -rf "$BASE" && mkdir -p "$BASE"
    git archive "$rev" | tar -x -C "$BASE"
    git rev-parse --short "$rev" > "$BASE/.ab_rev"
    echo "ab_trees: $rev ($(cat "$BASE/.ab_rev")) in $BASE ($(du -sh "$BASE" | cut -f1)); carry .peers/ab_base"
    ;;
  run)
    rounds=${2:?"usage: scripts/ab_trees.sh run ROUNDS COMMAND"}
    cmd=${3:?"usage: scripts/ab_trees.sh run ROUNDS COMMAND"}
    [ -d "$BASE" ] || { echo "ab_trees: $BASE is missing: run 'scripts/ab_trees.sh prepare REV' here and carry .peers/ab_base"; exit 2; }
    OUT=${OUT:-$ROOT/ab_out}
    mkdir -p "$OUT"
    export MAX_JOBS=8 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} PYTHONUNBUFFERED=1
    echo "ab_trees: new = the working tree, base = $(cat "$BASE/.ab_rev" 2>/dev/null || echo '?')" | tee "$OUT/ab.txt"
    t0=$(date +%s)
    (python3 setup.py build_ext --inplace > "$OUT/build_new.log" 2>&1; echo "new $?" > "$OUT/.rc_new") &
    (cd "$BASE" && python3 setup.py build_ext --inplace > "$OUT/build_base.log" 2>&1; echo "base $?" > "$OUT/.rc_base") &
    wait
    echo "ab_trees: builds $(( $(date +%s) - t0 )) s, exit status $(cat "$OUT/.rc_new") / $(cat "$OUT/.rc_base")" | tee -a "$OUT/ab.txt"
    if ! grep -q " 0$" "$OUT/.rc_new" || ! grep -q " 0$" "$OUT/.rc_base"; then
      tail -20 "$OUT/build_new.log" "$OUT/build_base.log"
      exit 1
    fi
    for r in $(seq 1 "$rounds"); do
      for side in new base; do
        tree=$([ $side = new ] && echo "$ROOT" || echo "$BASE")
        (cd "$tree" && PYTHONPATH=$tree timeout "${AB_TIMEOUT_S:-120}" bash -c "$cmd") 2>&1 | sed "s/^/$side r$r /" | tee -a "$OUT/ab.txt"
      done
    done
    ;;
  *)
    echo "usage: scripts/ab_trees.sh prepare REV | run ROUNDS COMMAND"
    exit 2
    ;;
esac
