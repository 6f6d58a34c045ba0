export OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 MLA_DECODE_CUDA=1
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
python3 -m pytest -v -x -p no:cacheprovider tests/test_validation.py -k cuda 2>&1 | tail -15
ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats python3 scripts/profile_cases.py > $OUT/ncu.txt 2>&1; echo ncu rc=$?
grep -E "mla_decode_split_kernel|combine_kernel|Duration|Registers|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Stall|Memory Throughput|DRAM Throughput|Compute \(SM\)|Eligible|No Eligible|Dynamic Shared" $OUT/ncu.txt | head -120
