#!/usr/bin/env bash
# Backtrace of a crashing test on the device (cuda-gdb works without GPU code too).
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 MLA_DECODE_CUDA=1
python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
cuda-gdb -batch -ex run -ex bt --args python3 -c "
import torch, mla_decode
q = torch.randn(16, 576, device='cuda', dtype=torch.bfloat16)
kv = torch.randn(40, 1, 576, device='cuda', dtype=torch.bfloat16)
qo = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device='cuda')
kvp = torch.tensor([0, 10, 10, 30], dtype=torch.int32, device='cuda')
try:
    torch.ops.mla_decode.decode(q, kv, None, qo, kvp, None, None, None, 1, 0.04, 0)
except RuntimeError as e:
    print('raised:', str(e)[:200])
" 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -40
