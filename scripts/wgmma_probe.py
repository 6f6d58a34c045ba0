"""Checks the narrow kernel's wgmma operand layouts (scripts/wgmma_probe.cu) on an H100/H200:
one m64n16k16 bf16 wgmma per mode, against torch. Needs nvcc and an sm_90 GPU:
    python3 scripts/wgmma_probe.py
Mode 0: QK's layout (A = 64 key rows, K-major). Mode 1: PV's (A = V^T read M-major from key
rows, the transpose bit). Prints the largest error per mode; exits 1 on a mismatch."""
import ctypes
import sys

import torch

from cuda_probe import load_probe

probe = load_probe("wgmma_probe").wgmma_probe
probe.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

torch.manual_seed(0)
dev = torch.device("cuda")
bad = 0
for mode in (0, 1):
    a = torch.randn(64, 16, device=dev).to(torch.bfloat16) if mode == 0 else \
        torch.randn(16, 64, device=dev).to(torch.bfloat16)  # mode 1: v[key][dim]
    b = torch.randn(16, 16, device=dev).to(torch.bfloat16)  # rows = N (heads), columns = K
    d = torch.full((64, 16), float("nan"), device=dev)
    rc = probe(a.data_ptr(), b.data_ptr(), d.data_ptr(), mode)
    a_mk = a.float() if mode == 0 else a.float().t()  # (M, K)
    ref = a_mk @ b.float().t()
    err = (d - ref).abs().max().item()
    ok = rc == 0 and err < 1e-3
    bad += not ok
    print(f"mode {mode} ({'QK: A K-major' if mode == 0 else 'PV: A = V^T M-major'}): rc={rc} max |d - ref| = {err:.3g}"
          f" -> {'ok' if ok else 'MISMATCH'}")
    if not ok:
        print("d[:4, :4] =", d[:4, :4].tolist(), "\nref[:4, :4] =", ref[:4, :4].tolist())
sys.exit(1 if bad else 0)
