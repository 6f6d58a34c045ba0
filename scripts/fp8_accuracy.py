"""Accuracy of the fp8 decode kernel against the float64 reference on the same
dequantised cache: the single-score LSE error over many one-key rows (the QK
accumulation alone), and long rows (the PV accumulation over many tiles).
Usage: MLA_DECODE_FP8_KERNEL=wgmma python3 scripts/fp8_accuracy.py (the
Hopper kernel; without the variable, the default mma.sync kernel)"""
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import mla_decode  # noqa: E402,F401
from cases import make_case  # noqa: E402

dev = torch.device("cuda")
for name, lengths, heads in (("one key x 2048 rows", [1] * 2048, 16), ("one key, H=128", [1] * 64, 128),
                             ("long rows", [8192, 3000, 64], 16)):
    case = make_case("fp8", "indptr", heads, 1, lengths, seed=3, device=dev)
    for splits in (1, 0):
        out, lse = torch.ops.mla_decode.decode(*case.args(), splits)
        torch.cuda.synchronize()
        out64, lse64 = out.double().cpu(), lse.double().cpu()
        d = (lse64 - case.ref_lse).abs()
        rel = float((out64 - case.ref_out).norm() / case.ref_out.norm())
        print(f"{name:22s} splits={splits}: lse err max {float(d.max()):.2e} rms {float(d.pow(2).mean().sqrt()):.2e}"
              f" | out rel fro {rel:.2e}")
