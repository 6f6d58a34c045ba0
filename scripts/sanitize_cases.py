"""Small decode cases for compute-sanitizer (memcheck, racecheck, synccheck, initcheck): every
format (or those named on the command line) and layout, forced splits, ragged lengths with 0,
H = 16, 64 and 128, each on every split kernel that can run it on this GPU (tests/cases.py
kernel_variants: the plan's choice and each other kernel forced in-process), then the
competition's exact layout as custom_kernel sees it. Run by scripts/gpu_check.sh sanitize."""
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import mla_decode  # noqa: E402,F401
from cases import FORMATS, LAYOUTS, check_against_reference, kernel_variants, make_case, run_case  # noqa: E402

n = 0
ran = {}
for fmt in sys.argv[1:] or FORMATS:
    for layout in LAYOUTS:
        # (64, 1, 1): one CTA walks 5 key tiles of 64, so the Hopper kernels' rings wrap;
        # (16, 1, 12): the combine's variant for 9 to 16 splits.
        for heads, q_len, splits, lengths in ((16, 1, 0, [70, 0, 33]), (128, 2, 3, [70, 0, 33]),
                                              (64, 1, 1, [300, 0, 33]), (16, 1, 1, [300, 0, 33]),
                                              (16, 1, 12, [1000, 0, 33])):
            case = make_case(fmt, layout, heads, q_len, lengths, seed=n, device=torch.device("cuda"))
            for ov in kernel_variants(case):
                out, lse = run_case(case, splits, ov)
                torch.cuda.synchronize()
                check_against_reference(case, out, lse)
                key = "plan" if ov is None else ",".join(f"{k}={v}" for k, v in ov.items())
                ran[key] = ran.get(key, 0) + 1
                n += 1
checked = n
from mla_decode.inputs import generate_input  # noqa: E402

for fmt in [f for f in sys.argv[1:] or FORMATS if f in ("bf16", "fp8", "mxfp4")]:
    q, kvd, qo, kvp, cfg = generate_input(4, 1, 512, seed=n, device="cuda")
    cache, scale = (kvd["bf16"], None) if fmt == "bf16" else kvd[fmt]
    for splits in (0, 1, 4):
        torch.ops.mla_decode.decode(q, cache, scale, qo, kvp, None, None, None, 1, cfg["sm_scale"], splits)
        torch.cuda.synchronize()
        n += 1
print(f"sanitize cases: {n} ran, the first {checked} matched the reference; by kernel: {ran}")
