"""Small decode cases for compute-sanitizer (memcheck, racecheck): every
format (or those named on the command line) and layout, forced splits, ragged
lengths with 0, H = 16 and 128."""
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
        for heads, q_len, splits in ((16, 1, 0), (128, 2, 3)):
            case = make_case(fmt, layout, heads, q_len, [70, 0, 33], seed=n, device=dev)
            out, lse = torch.ops.mla_decode.decode(*case.args(), splits)
            torch.cuda.synchronize()
            check_against_reference(case, out, lse)
            n += 1
print(f"sanitize cases: {n} ran and matched the reference")
