"""A few decode calls between cudaProfilerStart/Stop, for ncu:
    ncu --profile-from-start off --clock-control none --set full python3 scripts/profile_cases.py
Cases are given as FORMAT:BATCH:KV:HEADS[:SPLITS] (default: the extreme competition shapes;
SPLITS 0 or absent: the planned split count)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mla_decode  # noqa: E402,F401
from mla_decode.inputs import generate_input  # noqa: E402

cases = sys.argv[1:] or ["bf16:4:1024:16", "fp8:256:8192:16", "mxfp4:256:8192:16", "bf16:256:8192:16"]
runs = []
for spec in cases:
    fmt, b, kv, h, *rest = spec.split(":")
    splits = int(rest[0]) if rest else 0
    q, kv_data, qo, kvp, cfg = generate_input(int(b), 1, int(kv), seed=1, device="cuda", num_heads=int(h))
    cache, scale = (kv_data["bf16"], None) if fmt == "bf16" else kv_data[fmt]
    args = (q, cache, scale, qo, kvp, None, None, None, 1, cfg["sm_scale"], splits)
    torch.ops.mla_decode.decode(*args)  # warm-up
    runs.append((spec, args))
torch.cuda.synchronize()
torch.cuda.profiler.start()
for spec, args in runs:
    torch.ops.mla_decode.decode(*args)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("profiled:", ", ".join(s for s, _ in runs))
