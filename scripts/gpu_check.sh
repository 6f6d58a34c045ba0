#!/usr/bin/env bash
# One device session: build the CUDA extension, run the whole test suite
# (GPU tests included), optionally the benchmark and compute-sanitizer, and
# leave logs under $OUT (or ./gpu_out). Usage: scripts/gpu_check.sh [tests] [bench] [sanitize]
# (sanitize also runs the fp8 cases on the opt-in Hopper kernel, MLA_DECODE_FP8_KERNEL=wgmma)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MLA_DECODE_CUDA=1 PYTHONUNBUFFERED=1
steps=${*:-tests bench}
{
  echo "== $(date -u +%FT%TZ) commit ${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} $(git status --porcelain 2>/dev/null | wc -l) dirty files"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} | tee "$OUT/env.txt"
t0=$(date +%s)
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"; grep -E "registers|spill" "$OUT/build.log" | sort | uniq | head -20
rc=0
for step in $steps; do
  case $step in
    tests)
      python3 -m pytest -q -x -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -25 || rc=1 ;;
    bench)
      python3 benchmarks/bench_decode.py --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -40 || rc=1 ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py > "$OUT/sanitize_$tool.log" 2>&1
        echo "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
        MLA_DECODE_FP8_KERNEL=wgmma compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_cases.py fp8 \
          > "$OUT/sanitize_${tool}_wgmma.log" 2>&1
        echo "compute-sanitizer $tool (fp8, wgmma kernel): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_wgmma.log" | tail -1)"
      done ;;
  esac
done
exit $rc
