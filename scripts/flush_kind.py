"""How much of a protocol call is the flush's dirty L2 (a diagnosis, not the protocol).

The competition flushes L2 by *writing* a buffer larger than L2 (mla_decode.timing.L2Flusher),
so a timed call starts with L2 full of dirty lines: each line the call's reads evict first costs
a DRAM write. This script times custom_kernel at the competition shapes after three flushes:

    write   the protocol's (zero_ of 256 MB): L2 full of dirty lines
    read    a reduction over the same buffer: L2 full of clean, unrelated lines
    none    no flush (the previous call's cache lines may still be in L2)

    python3 scripts/flush_kind.py [fmt ...] [--shapes B:KV,...] [--iters N]

Prints the trimmed mean (us) per shape and the geometric mean per flush kind.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mla_decode  # noqa: E402
from mla_decode.inputs import generate_input  # noqa: E402
from mla_decode.timing import FLUSH_BYTES, time_protocol  # noqa: E402


class Flush:
    def __init__(self, kind: str, buf: torch.Tensor):
        self.kind = kind
        self.buf = buf  # one 256 MB int32 buffer shared by the kinds
        self.acc = torch.empty((), dtype=torch.int64, device=buf.device)

    def flush(self):
        if self.kind == "write":
            self.buf.zero_()
        elif self.kind == "read":
            torch.sum(self.buf, 0, out=self.acc)


def main():
    args = sys.argv[1:]
    iters = 30
    shapes = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]
    if "--iters" in args:
        i = args.index("--iters")
        iters = int(args[i + 1])
        del args[i:i + 2]
    if "--shapes" in args:
        i = args.index("--shapes")
        shapes = [tuple(int(x) for x in s.split(":")) for s in args[i + 1].split(",")]
        del args[i:i + 2]
    fmts = args or ["bf16", "fp8", "mxfp4"]
    dev = torch.device("cuda")
    kinds = ["write", "read", "none"]
    buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    flushers = {k: Flush(k, buf) for k in kinds}
    print(f"{'format':6} {'shape':12} " + " ".join(f"{k:>8}" for k in kinds) + "   (us, trimmed mean)")
    logs = {(f, k): [] for f in fmts for k in kinds}
    for b, kv in shapes:
        data = generate_input(b, 1, kv, seed=3, device=dev)
        for fmt in fmts:
            os.environ["MLA_DECODE_FORMAT"] = fmt
            res = []
            for k in kinds:
                ts = sorted(time_protocol(lambda i: mla_decode.custom_kernel(data), iters, 3, flushers[k], dev))
                cut = ts[2:-2] if len(ts) > 6 else ts
                t = sum(cut) / len(cut)
                logs[(fmt, k)].append(math.log(t))
                res.append(t)
            print(f"{fmt:6} b{b:<4} kv{kv:<5} " + " ".join(f"{t:8.2f}" for t in res), flush=True)
        del data
    for fmt in fmts:
        print(f"geomean {fmt:6} " + " ".join(f"{k}={math.exp(sum(logs[(fmt, k)]) / len(logs[(fmt, k)])):.2f}"
                                              for k in kinds))


if __name__ == "__main__":
    main()
