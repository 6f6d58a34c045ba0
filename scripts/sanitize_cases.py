"""Small decode cases for compute-sanitizer (memcheck, racecheck): every
format (or those named on the command line) and layout, forced splits, ragged
lengths with 0, H = 16, 64 and 128."""
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import mla_decode  # noqa: E402,F401
from cases import FORMATS, LAYOUTS, check_against_reference, make_case  # noqa: E402

dev = torch.device("cuda")
n = 0
for fmt in sys.argv[1:] or FORMATS:
    for layout in LAYOUTS:
        # (64, 1, 1): one CTA walks 5 key tiles of 64, so the wide kernel's ring wraps.
        for heads, q_len, splits, lengths in ((16, 1, 0, [70, 0, 33]), (128, 2, 3, [70, 0, 33]),
                                              (64, 1, 1, [300, 0, 33])):
            case = make_case(fmt, layout, heads, q_len, lengths, seed=n, device=dev)
            out, lse = torch.ops.mla_decode.decode(*case.args(), splits)
            torch.cuda.synchronize()
            check_against_reference(case, out, lse)
            n += 1
# The competition's exact layout (rows = batch x kv_len, kv_indptr from 0,
# no NaN rows), as custom_kernel sees it: planned, one and four splits.
from mla_decode.inputs import generate_input  # noqa: E402

competition_fmts = [f for f in sys.argv[1:] or FORMATS if f in ("bf16", "fp8", "mxfp4")]
for fmt in competition_fmts:
    q, kvd, qo, kvp, cfg = generate_input(4, 1, 512, seed=n, device="cuda")
    cache, scale = (kvd["bf16"], None) if fmt == "bf16" else kvd[fmt]
    for splits in (0, 1, 4):
        torch.ops.mla_decode.decode(q, cache, scale, qo, kvp, None, None, None, 1, cfg["sm_scale"], splits)
        torch.cuda.synchronize()
        n += 1
print(f"sanitize cases: {n} ran (the first {n - 3 * len(competition_fmts)} matched the reference)")
