"""Checks the TMA + e4m3-wgmma QK of the next narrow-kernel design (scripts/tma_qk_probe.cu) on an
H100/H200 against a float64 reference on the same fp8 codes: one 64-key tile, 16 heads, Q as three
e4m3 terms (exact for a bf16 Q), the 18 k-steps accumulated by the tensor cores in groups of 18, 6,
2 or 1, promoted to fp32 between groups. Cases: contiguous rows, padded rows (stride 640), a tile
that runs past the last row (TMA zero-fills those keys). Prints the error relative to max |S| next
to what an f16 Q (today's narrow kernel) gives; exits 1 on a mismatch. Needs nvcc and an sm_90 GPU:
    python3 scripts/tma_qk_probe.py"""
import ctypes
import sys

import torch

from cuda_probe import load_probe

probe = load_probe("tma_qk_probe").tma_qk_probe
probe.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_int]

torch.manual_seed(0)
dev = torch.device("cuda")
bad = 0
for name, rows, stride, row0 in [("contiguous", 200, 576, 37), ("padded rows", 200, 640, 64),
                                 ("past the last row", 100, 576, 60)]:
    kv_f = torch.randn(rows, 576, device=dev) * 2.0
    codes = kv_f.to(torch.float8_e4m3fn).view(torch.uint8)
    buf = torch.full((rows, stride), 0x7F, dtype=torch.uint8, device=dev)  # NaN codes in the padding
    buf[:, :576] = codes
    q = (torch.randn(16, 576, device=dev) * torch.logspace(-2, 1, 16, device=dev)[:, None]).to(torch.bfloat16)
    errs = {}
    for steps in (18, 6, 2, 1):  # k-steps per tensor-core accumulation group
        s_g = torch.full((64, 16), float("nan"), device=dev)
        rc_g = probe(buf.data_ptr(), rows, stride, row0, q.data_ptr(), s_g.data_ptr(), steps)
        errs[steps] = (rc_g, s_g)
    rc, s = errs[18]
    keys = torch.zeros(64, 576, dtype=torch.float64, device=dev)
    n = min(64, rows - row0)
    keys[:n] = codes[row0:row0 + n].view(torch.float8_e4m3fn).double()
    ref = keys @ q.double().t()
    # Today's narrow kernel: Q scaled per head into f16 (max |q| 2^e in [2^14, 2^15)).
    e = 14 - torch.floor(torch.log2(q.double().abs().amax(dim=1)))
    q16 = (q.double() * 2.0 ** e[:, None]).half().double() / 2.0 ** e[:, None]
    ref16 = keys @ q16.t()
    scale = ref.abs().amax(dim=0).clamp_min(1e-30)  # per head
    err = ((s.double() - ref).abs() / scale).max().item()
    by_group = ", ".join(f"{k} steps/group {((v[1].double() - ref).abs() / scale).max().item():.2g}"
                         for k, v in errs.items())
    err16 = ((ref16 - ref).abs() / scale).max().item()
    ok = rc == 0 and err < 4e-3 and torch.isfinite(s).all().item()
    bad += not ok
    print(f"{name:18s} rc={rc} max |S - ref| / max_head |ref| = {err:.3g} (f16 Q: {err16:.3g}) -> "
          f"{'ok' if ok else 'MISMATCH'}\n    {by_group}")
    if not ok and rc == 0:
        print("S[:4, :4] =", s[:4, :4].tolist(), "\nref[:4, :4] =", ref[:4, :4].tolist())
sys.exit(1 if bad else 0)
