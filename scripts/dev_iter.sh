#!/usr/bin/env bash
# Development iteration on the device: build, locate crashes, full tests, benchmark.
set -uo pipefail
export OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 MLA_DECODE_CUDA=1 PYTHONUNBUFFERED=1
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
python3 -m pytest -v -p no:cacheprovider tests/test_validation.py -k cuda 2>&1 | grep -E "PASSED|FAILED|ERROR|Fatal|passed|failed" | tail -4
python3 -m pytest -q -x -p no:cacheprovider tests --deselect tests/test_validation.py 2>&1 | tail -4
python3 benchmarks/bench_decode.py --out $OUT/bench ${BENCH_ARGS:-} > $OUT/bench.log 2>&1; tail -${BENCH_TAIL:-12} $OUT/bench.log
bash scripts/sass_histogram.sh > $OUT/sass_hist.txt 2>&1
cut -d, -f3-5,10 $OUT/bench/competition.csv | paste -sd' ' 
