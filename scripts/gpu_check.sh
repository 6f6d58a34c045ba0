#!/usr/bin/env bash
# One device session: build the CUDA extension, run the whole test suite
# (GPU tests included), optionally the benchmark, an A/B comparison and
# compute-sanitizer, and leave logs under $OUT (or ./gpu_out).
#   Usage: scripts/gpu_check.sh [tests] [bench] [ab] [patchab] [sanitize]
#   tests     the whole pytest suite
#   bench     benchmarks/bench_decode.py (competition protocol + H = 128 sweep),
#             then the H = 64 sweep (SWEEP_H64=0 skips it)
#   ab        the competition protocol only, alternately with MLA_DECODE_EXP (or the
#             variable named by $AB_VAR) set to each value of $AB (default
#             "0 1 0 1"), for an experiment switch read by the code under test;
#             scripts/ab_table.py prints the per-shape table; $AB_ARGS adds
#             benchmark options (e.g. "--formats fp8")
#   patchab   an experiment patch against this tree in one call: $AB_PATCH (e.g.
#             docs/experiments/X.patch) applied to a copy in /tmp/patched and
#             built there; the tests of $PATCH_TESTS_K (pytest -k, on the copy;
#             none when unset); then the competition protocol alternately on
#             this tree and the copy ($AB_ROUNDS rounds, default 2; $AB_ARGS),
#             and scripts/ab_table.py's table (columns "main" / "patched")
#   sanitize  compute-sanitizer on scripts/sanitize_cases.py, each tool of
#             $SANITIZE_TOOLS (default: memcheck racecheck synccheck initcheck),
#             again with the Hopper wide kernel forced for H >= 64
#             (MLA_DECODE_*_KERNEL=wide), with the narrow kernel forced for
#             fp8 / MXFP4 / bf16 at H < 64, and for the fp8 cases on the opt-in
#             Hopper kernel (MLA_DECODE_FP8_KERNEL=wgmma); the narrow pass with
#             the f16 QK (MLA_DECODE_NARROW_QK=f16), then fp8 on the default
#             register-V kernel (decode_kernel_narrow_fp8_sm90.cuh)
# GIT_COMMIT=<sha> labels the logs and the benchmark's output; pass it on the
# lent device, whose copy of .git can be stale (else: git rev-parse HEAD).
# Narrowing (for a second pass over one kernel in the same call):
#   TESTS_K="mxfp4"           pytest -k expression for the tests step
#   SANITIZE_FORMATS="mxfp4"  formats for the sanitize step (the wgmma pass runs
#                             only when fp8 is among them)
# Every step has a time limit and writes its log straight into $OUT, so a hang
# or a step cut short still leaves what it printed (the device returns $OUT
# even when the call runs out of time). A test that hangs is reported by
# pytest's faulthandler after $HANG_S seconds with the Python stack of the
# waiting call (session 6: a deadlocked kernel showed as a host wait in .cpu()).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MLA_DECODE_CUDA=1 PYTHONUNBUFFERED=1
TESTS_S=${TESTS_S:-300} BENCH_S=${BENCH_S:-240} AB_RUN_S=${AB_RUN_S:-60} SANITIZE_S=${SANITIZE_S:-120} HANG_S=${HANG_S:-60}
steps=${*:-tests bench}
{
  echo "== $(date -u +%FT%TZ) commit $GIT_COMMIT $(git status --porcelain 2>/dev/null | wc -l) dirty files"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} | tee "$OUT/env.txt"
t0=$(date +%s)
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"; grep -E "^ptxas|bytes spill" "$OUT/build.log" | sort | uniq | head -20
rc=0
# One competition-protocol run of an A/B step: the header line scripts/ab_table.py
# reads ("## MLA_DECODE_EXP=LABEL") and the benchmark's output appended to LOG,
# run in the tree DIR (first on PYTHONPATH) with the environment VAR=VALUE arguments.
ab_run() {  # LOG LABEL DIR OUT_DIR [VAR=VALUE...]
  local log=$1 label=$2 dir=$3 out=$4
  shift 4
  echo "## MLA_DECODE_EXP=$label" >> "$log"
  (cd "$dir" && env PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" "$@" timeout "$AB_RUN_S" python3 \
    benchmarks/bench_decode.py --skip-sweep --no-progress --no-accuracy ${AB_ARGS:-} --out "$out" >> "$log" 2>&1)
}
for step in $steps; do
  t0=$(date +%s)
  case $step in
    tests)
      timeout "$TESTS_S" python3 -m pytest -q -x -p no:cacheprovider -o faulthandler_timeout="$HANG_S" ${TESTS_K:+-k "$TESTS_K"} tests \
        > "$OUT/pytest.log" 2>&1
      r=$?; [ $r -ne 0 ] && rc=1
      [ $r -eq 124 ] && echo "pytest: TIMED OUT after $TESTS_S s (a hang? see the faulthandler stack in pytest.log)"
      grep -E "passed|failed|Timeout|Error" "$OUT/pytest.log" | tail -8 ;;
    bench)
      timeout "$BENCH_S" python3 benchmarks/bench_decode.py --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1 || rc=1
      sed -n '/^SUMMARY/,$p' "$OUT/bench.log"
      # The H = 64 sweep too (TP2; the wide kernel's other head count), unless SWEEP_H64=0.
      if [ "${SWEEP_H64:-1}" != 0 ]; then
        timeout "$BENCH_S" python3 benchmarks/bench_decode.py --no-progress --skip-competition --sweep-heads 64 \
          --out "$OUT/bench/h64" > "$OUT/bench_h64.log" 2>&1 || rc=1
        grep -A4 "^sweep H=64 geomean" "$OUT/bench_h64.log"
      fi
      rm -f "$OUT"/bench/*.png "$OUT"/bench/results.json "$OUT"/bench/h64/*.png "$OUT"/bench/h64/results.json ;;  # the device returns few files; the CSVs and the logs suffice
    ab)
      : > "$OUT/ab.log"
      for e in ${AB:-0 1 0 1}; do
        ab_run "$OUT/ab.log" "$e (${AB_VAR:-MLA_DECODE_EXP})" "$PWD" "/tmp/ab_$e" "${AB_VAR:-MLA_DECODE_EXP}=$e" || rc=1
      done
      python3 scripts/ab_table.py "$OUT/ab.log" ;;
    sanitize)
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
        timeout "$SANITIZE_S" compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py \
          ${SANITIZE_FORMATS:-} > "$OUT/sanitize_$tool.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer $tool: rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
        # The sanitize cases are below the wide kernel's size threshold: force it for H >= 64.
        MLA_DECODE_BF16_KERNEL=wide MLA_DECODE_FP8_KERNEL=wide MLA_DECODE_MXFP4_KERNEL=wide timeout "$SANITIZE_S" \
          compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py ${SANITIZE_FORMATS:-} \
          > "$OUT/sanitize_${tool}_wide.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer $tool (wide kernel forced): rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_wide.log" | tail -1)"
        # The Hopper narrow kernel (H < 64, fp8 and MXFP4), forced onto the small cases.
        MLA_DECODE_FP8_KERNEL=narrow MLA_DECODE_MXFP4_KERNEL=narrow MLA_DECODE_BF16_KERNEL=narrow \
          MLA_DECODE_NARROW_QK=f16 timeout "$SANITIZE_S" \
          compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py ${SANITIZE_FORMATS:-} \
          > "$OUT/sanitize_${tool}_narrow.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer $tool (narrow kernel forced): rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_narrow.log" | tail -1)"
        case " ${SANITIZE_FORMATS:-fp8} " in *" fp8 "*) ;; *) continue ;; esac
        MLA_DECODE_FP8_KERNEL=wgmma timeout "$SANITIZE_S" compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 scripts/sanitize_cases.py fp8 > "$OUT/sanitize_${tool}_wgmma.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer $tool (fp8, wgmma kernel): rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_wgmma.log" | tail -1)"
        # The register-V narrow kernel (fp8, indptr layout: TMA-landed codes, e4m3 QK).
        MLA_DECODE_FP8_KERNEL=narrow timeout "$SANITIZE_S" compute-sanitizer --tool $tool \
          --error-exitcode 9 python3 scripts/sanitize_cases.py fp8 > "$OUT/sanitize_${tool}_e4m3qk.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer $tool (fp8, narrow register-V): rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_e4m3qk.log" | tail -1)"
      done ;;
    patchab)
      patch_abs=$PWD/${AB_PATCH:?patchab needs AB_PATCH=path of a patch}
      rm -rf /tmp/patched && mkdir -p /tmp/patched
      cp -r setup.py pyproject.toml csrc mla_decode benchmarks tests scripts README.md /tmp/patched/
      if ! (cd /tmp/patched && git apply "$patch_abs") > "$OUT/patch_apply.log" 2>&1; then
        echo "patchab: $AB_PATCH does not apply"; cat "$OUT/patch_apply.log"; rc=1; continue
      fi
      if ! (cd /tmp/patched && python3 setup.py build_ext --inplace) > "$OUT/build_patched.log" 2>&1; then
        tail -30 "$OUT/build_patched.log"; echo "patchab: BUILD FAILED"; rc=1; continue
      fi
      grep -E "C75|bytes spill" "$OUT/build_patched.log" | sort | uniq | head -5
      if [ -n "${PATCH_TESTS_K:-}" ]; then
        (cd /tmp/patched && PYTHONPATH=/tmp/patched timeout "$TESTS_S" python3 -m pytest -q -x -p no:cacheprovider \
          -o faulthandler_timeout="$HANG_S" -k "$PATCH_TESTS_K" tests > "$OUT/pytest_patched.log" 2>&1)
        r=$?; [ $r -ne 0 ] && rc=1
        echo "patched tests ($PATCH_TESTS_K): rc=$r $(grep -E 'passed|failed' "$OUT/pytest_patched.log" | tail -1)"
      fi
      : > "$OUT/patchab.log"
      for i in $(seq "${AB_ROUNDS:-2}"); do
        ab_run "$OUT/patchab.log" main "$PWD" /tmp/patchab_main || rc=1
        ab_run "$OUT/patchab.log" patched /tmp/patched /tmp/patchab_patched || rc=1
      done
      python3 scripts/ab_table.py "$OUT/patchab.log" ;;
    *) echo "gpu_check: unknown step '$step' (tests, bench, ab, patchab, sanitize)"; rc=1 ;;
  esac
  echo "$step: $(( $(date +%s) - t0 )) s"
done
exit $rc
