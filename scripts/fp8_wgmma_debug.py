"""Where the fp8 decode kernel disagrees with the reference, by head and by
value-dim block: a wrong QK operand layout shows in the LSE, a wrong PV layout
in the output only. Usage: python3 scripts/fp8_wgmma_debug.py [length ...]"""
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import mla_decode  # noqa: E402,F401
from cases import make_case  # noqa: E402

lengths = [int(a) for a in sys.argv[1:]] or [64, 200, 1]
dev = torch.device("cuda")
case = make_case("fp8", "indptr", 16, 1, lengths, seed=3, device=dev)
out, lse = torch.ops.mla_decode.decode(*case.args(), 1)
torch.cuda.synchronize()
out64, lse64 = out.double().cpu(), lse.double().cpu()
ref_out, ref_lse = case.ref_out, case.ref_lse
torch.set_printoptions(precision=4, linewidth=200, sci_mode=True)
print("lengths", lengths)
print("lse - ref (token x head):\n", lse64 - ref_lse)
err = (out64 - ref_out).reshape(out64.shape[0], 16, 8, 64).norm(dim=-1)
den = ref_out.reshape(out64.shape[0], 16, 8, 64).norm(dim=-1)
print("out rel error per head (rows) x 64-dim block (cols), token 0:\n", (err / den)[0])
print("overall rel", float((out64 - ref_out).norm() / ref_out.norm()))
