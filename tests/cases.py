"""Builders of decode test cases shared by the CPU and GPU tests.

A case is random data (never zeros) in one cache format and one addressing
layout, with every cache row that no token references filled with NaN (or
the format's NaN encoding), plus the float64 reference computed on the same
dequantised cache that the kernel reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mla_decode.quant import quantize_fp8, quantize_mxfp4
from mla_decode.reference import dequantize_cache, reference_decode

FORMATS = ("bf16", "fp8", "fp8_fnuz", "mxfp4")
LAYOUTS = ("indptr", "indices", "paged")
SM_SCALE = 1.0 / math.sqrt(576)


@dataclass
class Case:
    q: torch.Tensor
    kv: torch.Tensor
    kv_scale: torch.Tensor | None
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor | None = None
    kv_indices: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    kv_lens: torch.Tensor | None = None
    page_size: int = 1
    ref_out: torch.Tensor | None = None
    ref_lse: torch.Tensor | None = None
    lengths: list = field(default_factory=list)

    def args(self):
        return (self.q, self.kv, self.kv_scale, self.qo_indptr, self.kv_indptr, self.kv_indices,
                self.block_table, self.kv_lens, self.page_size, SM_SCALE)


def _quantize(rows_bf16: torch.Tensor, fmt: str):
    """rows_bf16: (n, 576) -> (cache (n, 1, D), scale)."""
    kv = rows_bf16.unsqueeze(1)
    if fmt == "bf16":
        return kv.contiguous(), None
    if fmt == "fp8":
        return quantize_fp8(kv, torch.float8_e4m3fn)
    if fmt == "fp8_fnuz":
        return quantize_fp8(kv, torch.float8_e4m3fnuz)
    if fmt == "mxfp4":
        return quantize_mxfp4(kv)
    raise ValueError(fmt)


def _poison_rows(kv: torch.Tensor, scale, fmt: str, rows: torch.Tensor) -> None:
    """Fills cache rows `rows` with NaN in the format's own encoding."""
    if rows.numel() == 0:
        return
    if fmt == "bf16":
        kv[rows] = float("nan")
    elif fmt == "fp8":
        kv.view(torch.uint8)[rows] = 0x7F
    elif fmt == "fp8_fnuz":
        kv.view(torch.uint8)[rows] = 0x80
    else:
        scale.view(torch.uint8)[rows, :18] = 0xFF


def make_case(fmt: str, layout: str, num_heads: int, q_len: int, lengths, *, seed: int, device,
              page_size: int = 16, extra_rows: int = 37, q_scale: float = 1.0, row_pow2=(0, 0),
              scale_row_stride: int | None = None) -> Case:
    """q_scale multiplies the standard-normal queries (logits of standard deviation q_scale).
    row_pow2 = (e, period) multiplies cache rows by 2^e before quantisation: every row (period
    0) or the rows in odd runs of `period` rows. scale_row_stride (MXFP4): the block scales as a
    view of rows of that many bytes (the padding NaN scales)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = list(lengths)
    batch = len(lengths)
    total_tokens = sum(lengths)
    q = (torch.randn(batch * q_len, num_heads, 576, generator=gen) * q_scale).to(torch.bfloat16)
    qo_indptr = torch.arange(0, batch + 1, dtype=torch.int32) * q_len

    if layout == "paged":
        pages_per_item = [(n + page_size - 1) // page_size for n in lengths]
        num_pages = sum(pages_per_item) + 3  # spare pages stay NaN
        n_rows = num_pages * page_size
    else:
        n_rows = total_tokens + extra_rows
    rows = torch.randn(n_rows, 576, generator=gen)
    exp, period = row_pow2
    if exp:
        scaled = torch.ones(n_rows, dtype=torch.bool) if period == 0 else (torch.arange(n_rows) // period) % 2 == 1
        rows[scaled] *= 2.0 ** exp
    rows = rows.to(torch.bfloat16)
    kv, scale = _quantize(rows, fmt)
    if scale_row_stride is not None:
        if fmt != "mxfp4" or scale_row_stride < 18:
            raise ValueError("scale_row_stride: MXFP4 only, at least 18 bytes")
        scale_padded = torch.full((n_rows, scale_row_stride), 0xFF, dtype=torch.uint8)
        scale_padded[:, :18] = scale.view(torch.uint8)
        scale = scale_padded.view(scale.dtype)[:, :18]
    used = torch.zeros(n_rows, dtype=torch.bool)

    case = Case(q=q, kv=kv, kv_scale=scale, qo_indptr=qo_indptr, lengths=lengths)
    if layout == "indptr":
        # Items are consecutive runs of rows (indptr has no gaps); unused NaN rows
        # sit before the first item and after the last.
        offsets = [5]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        kv_indptr = torch.tensor(offsets, dtype=torch.int32)
        used[5:5 + total_tokens] = True
        case.kv_indptr = kv_indptr
    elif layout == "indices":
        perm = torch.randperm(n_rows, generator=gen)[:total_tokens].to(torch.int32)
        case.kv_indptr = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
        case.kv_indices = perm
        used[perm.long()] = True
    else:
        max_pages = max(max((n + page_size - 1) // page_size for n in lengths), 1) + 1
        page_perm = torch.randperm(n_rows // page_size, generator=gen).to(torch.int32)
        table = torch.full((batch, max_pages), 2**30, dtype=torch.int32)  # unused entries: never read
        k = 0
        for b, n in enumerate(lengths):
            for i in range((n + page_size - 1) // page_size):
                table[b, i] = page_perm[k]
                first = int(page_perm[k]) * page_size
                used[first:first + min(page_size, n - i * page_size)] = True
                k += 1
        case.block_table = table
        case.kv_lens = torch.tensor(lengths, dtype=torch.int32)
        case.page_size = page_size
        kv = kv.view(n_rows // page_size, page_size, 1, kv.shape[-1])
        case.kv = kv
    _poison_rows(case.kv.view(n_rows, 1, -1), scale, fmt, (~used).nonzero().flatten())

    kv_rows = dequantize_cache(case.kv, scale)
    case.ref_out, case.ref_lse = reference_decode(
        q, kv_rows, qo_indptr, SM_SCALE, kv_indptr=case.kv_indptr, kv_indices=case.kv_indices,
        block_table=case.block_table, kv_lens=case.kv_lens, page_size=case.page_size)

    def mv(t):
        return None if t is None else t.to(device)
    for name in ("q", "kv", "kv_scale", "qo_indptr", "kv_indptr", "kv_indices", "block_table", "kv_lens"):
        setattr(case, name, mv(getattr(case, name)))
    if scale_row_stride is not None:  # .to() of a view with gaps would make it contiguous
        case.kv_scale = scale_padded.view(scale.dtype).to(device)[:, :18]
    return case


# Tolerances, from the arithmetic rather than from observed results. The
# kernels read the same dequantised values as the reference, so the format's
# own error cancels out; what remains is bf16 rounding of the output (relative
# 2^-9 per element, ~1.1e-3 RMS), bf16 rounding of the probabilities on the
# GPU (same order), and fp32 accumulation (negligible). 8e-3 is ~3x that
# budget and ~2x below fp8's own quantisation error (1.5e-2), so using the
# wrong dequantisation, scale or row fails.
REL_FRO_TOL = 8e-3
LSE_ABS_TOL = 2e-3


def check_against_reference(case: Case, out: torch.Tensor, lse: torch.Tensor) -> None:
    ref_out, ref_lse = case.ref_out, case.ref_lse
    out64 = out.detach().cpu().double()
    lse64 = lse.detach().cpu().double()
    assert torch.isfinite(out64).all(), "output has NaN/inf where the reference is finite"
    empty = torch.isinf(ref_lse) & (ref_lse < 0)
    # Rows that see no key: exact zeros and -inf.
    assert (out64[empty] == 0).all(), "rows with no visible key must be exactly 0"
    assert (torch.isinf(lse64[empty]) & (lse64[empty] < 0)).all(), "rows with no visible key need lse = -inf"
    full = ~empty
    if full.any():
        num = (out64[full] - ref_out[full]).norm()
        den = ref_out[full].norm()
        rel = float(num / den)
        assert rel < REL_FRO_TOL, f"relative Frobenius error {rel:.3e} >= {REL_FRO_TOL}"
        lse_err = float((lse64[full] - ref_lse[full]).abs().max())
        assert lse_err < LSE_ABS_TOL, f"max |lse - ref| = {lse_err:.3e} >= {LSE_ABS_TOL}"


# ---- forcing kernels in-process -----------------------------------------------------------
# 99 KB: the per-block shared-memory opt-in of sm_86 / sm_89 / sm_120 parts, where fp8 (103 KB)
# and e4m3fnuz (102.5 KB) run a ring one stage shallower and bf16 never takes its deep ring.
SMEM_99KB = 99 * 1024


def explain_case(case: Case, num_splits: int = 0, overrides=None):
    import mla_decode
    return mla_decode.explain(case.q, case.kv, case.qo_indptr, kv_scale=case.kv_scale, kv_indptr=case.kv_indptr,
                              kv_indices=case.kv_indices, block_table=case.block_table, kv_lens=case.kv_lens,
                              page_size=case.page_size, sm_scale=SM_SCALE, num_splits=num_splits,
                              overrides=overrides)


def kernel_variants(case: Case):
    """The plan overrides that run `case` on every split kernel that can run it on its device
    (the planned one first; None is the plan itself), plus, on NVIDIA, the mma.sync kernel
    planned as on a 99 KB device. On the CPU: the plan alone."""
    if case.q.device.type != "cuda":
        return [None]
    plan = explain_case(case)
    variants = [None]
    for kernel, why in plan.rejected.items():
        if why.startswith("applies"):
            variants.append({"kernel": kernel})
    if torch.version.hip is None:
        variants.append({"kernel": "mma_sync", "smem_limit": SMEM_99KB})
    return variants


def run_case(case: Case, num_splits: int = 0, overrides=None):
    """decode_out on the case into NaN-poisoned outputs, with the plan `overrides` (None: the
    plan's own choice). Returns (out, lse)."""
    rows, heads = case.q.shape[0], case.q.shape[1]
    out = torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device=case.q.device)
    lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=case.q.device)
    if overrides is None:
        torch.ops.mla_decode.decode_out(*case.args(), num_splits, out, lse)
    else:
        import mla_decode
        from mla_decode.api import _overrides_text
        torch.ops.mla_decode._decode_out_with(*case.args(), num_splits, out, lse, _overrides_text(overrides))
    return out, lse


def check_every_kernel(case: Case, num_splits: int = 0) -> list:
    """Runs `case` on every kernel variant and checks each against the reference; returns the
    variants it ran (so a test can assert which kernels it covered)."""
    ran = []
    for ov in kernel_variants(case):
        out, lse = run_case(case, num_splits, ov)
        try:
            check_against_reference(case, out, lse)
        except AssertionError as e:
            raise AssertionError(f"{ov or 'the plan'}: {e}") from e
        ran.append(ov)
    return ran
