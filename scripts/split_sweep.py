"""Competition-protocol time of the decode operator for forced split counts
(num_splits argument), to tune the plan (csrc/plan).
Usage: python scripts/split_sweep.py [fmt ...] [--shapes B:KV,B:KV,...] [--heads H]"""
import sys

import torch

import mla_decode  # noqa: F401
from mla_decode.inputs import generate_input
from mla_decode.timing import L2Flusher, time_protocol

args = sys.argv[1:]
shape_arg = None
heads = 16
if "--heads" in args:
    i = args.index("--heads")
    heads = int(args[i + 1])
    del args[i:i + 2]
if "--shapes" in args:
    i = args.index("--shapes")
    shape_arg = args[i + 1]
    del args[i:i + 2]
fmts = args or ["bf16", "fp8"]
dev = torch.device("cuda")
flusher = L2Flusher(dev)
shapes = [(4, 1024), (4, 8192), (32, 1024), (64, 1024), (32, 8192), (256, 1024)]
if shape_arg:
    shapes = [tuple(int(x) for x in sh.split(":")) for sh in shape_arg.split(",")]
for fmt in fmts:
    for b, kv in shapes:
        q, kvd, qo, kvp, cfg = generate_input(b, 1, kv, seed=3, device="cuda", num_heads=heads)
        cache, scale = (kvd["bf16"], None) if fmt == "bf16" else kvd[fmt]
        res = []
        for ns in [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]:
            if ns * 32 > kv:
                continue
            call = lambda: torch.ops.mla_decode.decode(q, cache, scale, qo, kvp, None, None, None, 1, cfg["sm_scale"], ns)
            ts = time_protocol(lambda i: call(), 20, 3, flusher, dev)
            ts.sort()
            res.append(f"{ns}:{sum(ts[2:-2]) / len(ts[2:-2]):.1f}")
        print(fmt, b, kv, f"H={heads}", " ".join(res), flush=True)
