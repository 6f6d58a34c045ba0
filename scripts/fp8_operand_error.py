"""What e4m3 tensor-core operands would cost in accuracy: the error of MLA decode when Q and / or
P are narrowed to e4m3 before their products (as an fp8 `wgmma` kernel must: both operands of an
e4m3 product are e4m3), against the float64 reference on the same dequantised fp8 cache, with the
tests' measures (tests/cases.py: relative Frobenius error of the output, largest |LSE error|).

The cache is the tests' OCP fp8 cache (per-tensor scale, from bf16 rows of N(0, 1)); Q is bf16
N(0, q_scale). Forms of each operand:
  Q  bf16     the bf16 query (what the f16 / bf16 kernels multiply; exact here)
     e4m3     one e4m3 term per element, each head scaled by a power of two so its largest |q|
              lands in [2^7, 2^8) (the register-V kernel's scaling)
     2-term   hi = e4m3(x), mid = e4m3(16 (x - hi)): x ~ hi + mid / 16 (the register-V kernel's QK)
  P  bf16     P = 2^(s - m) rounded to bf16 (what the kernels multiply now)
     e4m3     P rounded to e4m3 (P <= 2^8 under the kernels' lazy rescaling, so no scale is
              needed: e4m3 reaches 448; values below 2^-9 flush to zero)
     2-term   hi + mid / 16 as for Q
The row sums l are taken from P in fp32 before rounding, as the kernels do. Products and sums are
exact here (float64): the e4m3 tensor cores' own accumulation (about 14 significant bits per
accumulation group, docs/kernels.md section 7) comes on top.

Usage: python scripts/fp8_operand_error.py [--heads 128] [--kv 1024,8192] [--q-scale 1,4] [--batch 4]
"""
import argparse
import itertools
import math

import torch

SM_SCALE = 1.0 / math.sqrt(576)
E4M3 = torch.float8_e4m3fn


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e4m3 value (saturating at 448; no NaN or inf in these inputs)."""
    return x.clamp(-448.0, 448.0).to(E4M3).double()


def terms(y: torch.Tensor, form: str) -> torch.Tensor:
    """y in float64 as the e4m3 forms represent it, unscaled: one term, or hi + mid / 16."""
    hi = e4m3(y)
    if form == "e4m3":
        return hi
    if form == "2-term":
        return hi + e4m3(16.0 * (y - hi)) / 16.0
    raise ValueError(form)


def narrow(x: torch.Tensor, form: str, dim: int = -1) -> torch.Tensor:
    """x in float64, narrowed to `form`, scaled per row along `dim` by a power of two so the row's
    largest magnitude lands in [2^7, 2^8) (and scaled back)."""
    if form == "bf16":
        return x.to(torch.bfloat16).double()
    amax = x.abs().amax(dim=dim, keepdim=True).clamp_min(1e-30)
    f = torch.exp2(7.0 - torch.floor(torch.log2(amax)))  # largest |x f| in [2^7, 2^8)
    return terms(x * f, form) / f


def narrow_p(p: torch.Tensor, form: str) -> torch.Tensor:
    """P narrowed to `form` without a scale (P <= 2^8 fits e4m3)."""
    if form == "bf16":
        return p.to(torch.bfloat16).double()
    return terms(p, form)


def run(heads: int, kv: int, q_scale: float, batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(batch, kv, 576, generator=gen).to(torch.bfloat16).float()
    scale = rows.abs().amax() / 448.0
    cache = (rows / scale).to(E4M3).double() * scale.double()  # the dequantised cache the kernel reads
    q = (torch.randn(batch, heads, 576, generator=gen) * q_scale).to(torch.bfloat16).double()
    s_ref = torch.einsum("bhd,bkd->bhk", q, cache) * SM_SCALE
    lse_ref = torch.logsumexp(s_ref, dim=-1)
    out_ref = torch.einsum("bhk,bkd->bhd", torch.softmax(s_ref, dim=-1), cache[..., :512])
    results = {}
    for qf, pf in itertools.product(("bf16", "e4m3", "2-term"), ("bf16", "e4m3", "2-term")):
        s = torch.einsum("bhd,bkd->bhk", narrow(q, qf), cache) * SM_SCALE
        m = s.amax(dim=-1, keepdim=True)
        # The kernels' reference maximum may sit up to 2^8 below a score (lazy rescaling); the
        # worst case for P's range is P up to 2^8, the common one P <= 1: take P <= 1 here.
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        out = torch.einsum("bhk,bkd->bhd", narrow_p(p, pf), cache[..., :512]) / l
        lse = (m + torch.log(l)).squeeze(-1)
        rel = float((out.to(torch.bfloat16).double() - out_ref).norm() / out_ref.norm())
        results[(qf, pf)] = (rel, float((lse - lse_ref).abs().max()))
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--kv", default="1024,8192")
    ap.add_argument("--q-scale", default="1,4")
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    print("tests' tolerances: relative Frobenius 8e-3, |LSE error| 2e-3 (tests/cases.py)")
    print(f"{'kv':>5} {'q_scale':>7} {'Q':>7} {'P':>7} {'rel Frobenius':>14} {'max |dLSE|':>11}")
    for kv in (int(x) for x in args.kv.split(",")):
        for qs in (float(x) for x in args.q_scale.split(",")):
            for (qf, pf), (rel, dl) in run(args.heads, kv, qs, args.batch).items():
                print(f"{kv:>5} {qs:>7g} {qf:>7} {pf:>7} {rel:>14.2e} {dl:>11.2e}")


if __name__ == "__main__":
    main()
