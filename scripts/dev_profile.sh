#!/usr/bin/env bash
# ncu view of the decode kernels on a few shapes (see scripts/profile_cases.py).
export OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 MLA_DECODE_CUDA=1
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats python3 scripts/profile_cases.py ${CASES:-} > $OUT/ncu.txt 2>&1; echo ncu rc=$?
grep -E "split_kernel|combine_kernel|Duration|DRAM Throughput|Issued Warp|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Stall|stall" $OUT/ncu.txt | grep -v "^ *----" | head -90
