#!/usr/bin/env bash
# One device session: build the CUDA extension, then run the steps given
# (default: tests bench), each under a time limit with its log in $OUT (or
# ./gpu_out), so a hang or a step cut short still leaves what it printed.
#   tests     the whole pytest suite (every GPU case on every applicable kernel)
#   bench     the benchmark (competition protocol + H = 128 sweep; its peers when
#             importable), then the H = 64 sweep (SWEEP_H64=0 skips it)
#   sanitize  compute-sanitizer (each tool of $SANITIZE_TOOLS, default memcheck
#             racecheck synccheck initcheck) on scripts/sanitize_cases.py, whose
#             cases run on every split kernel that can run them; then memcheck on
#             the hostile-input suite's GPU cases (tests/hostile_runner.py)
# GIT_COMMIT=<sha> labels the logs and the benchmark's output (the device's copy
# of .git can be stale). TESTS_K="mxfp4" narrows the tests step (pytest -k),
# SANITIZE_FORMATS="mxfp4" the sanitize step. A test that hangs is reported by
# pytest's faulthandler after $HANG_S seconds with the Python stack of the call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MLA_DECODE_CUDA=1 PYTHONUNBUFFERED=1
TESTS_S=${TESTS_S:-300} BENCH_S=${BENCH_S:-240} SANITIZE_S=${SANITIZE_S:-120} HANG_S=${HANG_S:-60}
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
    sanitize)
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
        timeout "$SANITIZE_S" compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py \
          ${SANITIZE_FORMATS:-} > "$OUT/sanitize_$tool.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer $tool: rc=$r $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
        grep "^sanitize cases" "$OUT/sanitize_$tool.log" | tail -1
      done
      # The hostile-input suite's GPU cases (malformed calls: clear errors, or NaN rows for bad
      # index values), default and checked mode, then the checked mode set by the environment.
      for dev in cuda,cuda-checked cuda-env; do
        timeout "$SANITIZE_S" compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/hostile_runner.py \
          --device $dev --all --check > "$OUT/hostile_memcheck_${dev%%,*}.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        echo "compute-sanitizer memcheck, hostile cases ($dev): rc=$r $(grep -E 'ERROR SUMMARY' "$OUT/hostile_memcheck_${dev%%,*}.log" | tail -1)"
      done ;;
    *) echo "gpu_check: unknown step '$step' (tests, bench, sanitize)"; rc=1 ;;
  esac
  echo "$step: $(( $(date +%s) - t0 )) s"
done
exit $rc
