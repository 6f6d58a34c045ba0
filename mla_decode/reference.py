"""Exact (float64) reference for absorbed-MLA decode attention.

* :func:`dequantize_cache` - any of the three cache formats -> float ``(rows, 576)``.
* :func:`reference_decode` - float64 attention output and natural-log LSE with indptr,
  indexed or paged addressing and the bottom-right causal mask for ``q_len > 1``.
* :func:`reference_custom_kernel` - the competition's tuple interface on top of it
  (pure-PyTorch fallback; returns bf16).
* :func:`rel_error` - NaN-aware relative Frobenius error.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .quant import FP4_DTYPE, dequantize_fp8, dequantize_mxfp4

__all__ = ["dequantize_cache", "reference_decode", "reference_custom_kernel", "rel_error"]

_FP8_DTYPES = tuple(
    d for d in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)
)
_V_DIM = 512


def dequantize_cache(
    kv_cache: torch.Tensor,
    kv_scale: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantise a KV cache to ``(rows, D)`` in ``dtype`` (float32 by default).

    The format follows the dtype:

    * bf16 / fp16 / fp32 / fp64 (``kv_scale`` must be None);
    * float8_e4m3fn / e4m3fnuz (``kv_scale``: one-element fp32 tensor) -> ``code * scale``
      (pass ``dtype=torch.float64`` for the exact product);
    * uint8 or float4_e2m1fn_x2 with last dim 288 -> MXFP4, ``kv_scale`` the 2-D E8M0
      scales (read through strides; rows beyond the cache and padded columns ignored; a
      paged ``(pages, page_size, 18)`` scale tensor is flattened to token rows).

    Accepted cache shapes: ``(rows, D)``, ``(rows, 1, D)``, ``(pages, page_size, D)``,
    ``(pages, page_size, 1, D)``; the result is flattened to token rows.
    """
    d = kv_cache.shape[-1]
    dt = kv_cache.dtype
    is_fp4 = (FP4_DTYPE is not None and dt == FP4_DTYPE) or dt == torch.uint8
    if dt in _FP8_DTYPES:
        if kv_scale is None:
            raise ValueError("fp8 cache needs its per-tensor scale")
        out = dequantize_fp8(kv_cache, kv_scale, dtype=dtype)
    elif is_fp4:
        if kv_scale is None:
            raise ValueError("MXFP4 cache needs its E8M0 scales")
        if d * 2 % 32 != 0:
            raise ValueError(f"MXFP4 cache: packed last dim {d} does not give whole 32-blocks")
        s = kv_scale
        if s.dim() > 2:
            s = s.reshape(-1, s.shape[-1])
        out = dequantize_mxfp4(kv_cache.reshape(-1, d), s, dtype=dtype)
    elif kv_cache.is_floating_point():
        if kv_scale is not None:
            raise ValueError(f"{dt} cache takes no scale")
        out = kv_cache.to(dtype)
    else:
        raise TypeError(f"dequantize_cache: unsupported cache dtype {dt}")
    return out.reshape(-1, out.shape[-1])


def _to_list(t, name: str = "index tensor") -> list:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"reference_decode: {name} must hold integers, but its dtype is {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"reference_decode: {name} must be 1-D, but it has shape {list(t.shape)}")
        return [int(v) for v in t.detach().cpu().tolist()]
    return [int(v) for v in t]


def _check_indptr(x: list, name: str, entries: int, bound: int, bound_what: str) -> None:
    """x: batch + 1 non-decreasing entries in [0, bound]."""
    if len(x) != entries:
        raise ValueError(f"reference_decode: {name} must have {entries} entries (batch_size + 1, the batch size "
                         f"being set by qo_indptr), but it has {len(x)}")
    if x[0] < 0:
        raise ValueError(f"reference_decode: {name}[0] must be >= 0, but it is {x[0]}")
    for b in range(len(x) - 1):
        if x[b + 1] < x[b]:
            raise ValueError(f"reference_decode: {name} must be non-decreasing, but {name}[{b + 1}] = {x[b + 1]} < "
                             f"{name}[{b}] = {x[b]}")
    if x[-1] > bound:
        raise ValueError(f"reference_decode: {name}[-1] = {x[-1]} exceeds {bound_what} ({bound})")


def reference_decode(
    q: torch.Tensor,
    kv_rows: torch.Tensor,
    qo_indptr,
    sm_scale: float,
    *,
    kv_indptr=None,
    kv_indices=None,
    block_table=None,
    kv_lens=None,
    page_size: int = 1,
    v_dim: int = _V_DIM,
    compute_device="cpu",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Float64 MLA decode: ``(out (total_q, H, v_dim), lse (total_q, H))`` on ``compute_device``.

    ``q``: ``(total_q, H, D)``; ``kv_rows``: dequantised ``(rows, D)`` cache (any float dtype;
    a ``(rows, 1, D)`` cache is flattened; V is the first ``v_dim`` columns of each row).

    Addressing of item b's keys (``b < len(qo_indptr) - 1``):

    * ``kv_indptr`` only: rows ``kv_indptr[b] .. kv_indptr[b+1]-1``;
    * ``kv_indptr`` + ``kv_indices``: rows ``kv_indices[kv_indptr[b] .. kv_indptr[b+1]-1]``;
    * ``block_table`` + ``kv_lens`` (+ ``page_size``): token j < kv_lens[b] is row
      ``block_table[b, j // page_size] * page_size + j % page_size``.

    Item b with ``Q`` queries and ``L`` keys: query i sees keys ``j < L - Q + i + 1``
    (bottom-right causal; no mask when Q == 1).  Scores ``sm_scale * q.k``; natural-log LSE.
    A query that sees no key gets ``out = 0`` and ``lse = -inf``; query rows not owned by any
    item (before ``qo_indptr[0]`` or from ``qo_indptr[-1]`` on) are left the same way.

    Malformed addressing raises ValueError naming the argument, the expected and the actual
    value: an indptr that decreases or leaves its range (q's rows; the cache's rows or
    kv_indices' length), a row or page outside the cache, a kv_lens entry outside the table.
    """
    cdev = torch.device(compute_device)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"reference_decode: q must be a (total_q, H, D) tensor, but it is "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    total_q, H, D = q.shape
    kv = kv_rows.reshape(-1, kv_rows.shape[-1])
    if kv.shape[-1] != D:
        raise ValueError(f"reference_decode: q's last dim ({D}) and the cache's ({kv.shape[-1]}) must be equal")
    rows_in_cache = kv.shape[0]
    qo = _to_list(qo_indptr, "qo_indptr")
    if len(qo) < 2:
        raise ValueError(f"reference_decode: qo_indptr must have batch_size + 1 >= 2 entries, but it has {len(qo)}")
    B = len(qo) - 1
    _check_indptr(qo, "qo_indptr", B + 1, total_q, "q's rows")
    paged = block_table is not None
    if paged:
        if kv_lens is None:
            raise ValueError("reference_decode: paged addressing (block_table) needs kv_lens")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"reference_decode: page_size must be a positive int, but it is {page_size!r}")
        lens = _to_list(kv_lens, "kv_lens")
        table = block_table.detach().to("cpu", torch.int64) if isinstance(block_table, torch.Tensor) \
            else torch.tensor(block_table, dtype=torch.int64)
        if table.dim() != 2 or table.shape[0] != B or len(lens) != B:
            raise ValueError(f"reference_decode: block_table must be (batch_size={B}, max_pages) and kv_lens "
                             f"({B},), but they have shapes {list(table.shape)} and ({len(lens)},)")
        pages_in_cache = rows_in_cache // page_size
        for b, L in enumerate(lens):
            if L < 0 or L > table.shape[1] * page_size:
                raise ValueError(f"reference_decode: kv_lens[{b}] = {L} must be in [0, max_pages x page_size = "
                                 f"{table.shape[1] * page_size}]")
            used = table[b, :(L + page_size - 1) // page_size]
            bad = ((used < 0) | (used >= pages_in_cache)).nonzero()
            if bad.numel():
                i = int(bad[0])
                raise ValueError(f"reference_decode: block_table[{b}][{i}] = {int(used[i])} is not a page of the "
                                 f"cache ({pages_in_cache} pages)")
    else:
        if kv_indptr is None:
            raise ValueError("reference_decode: give kv_indptr or block_table")
        kvp = _to_list(kv_indptr, "kv_indptr")
        idx_all = None
        if kv_indices is not None:
            idx_all = kv_indices.detach().to("cpu", torch.int64).reshape(-1) \
                if isinstance(kv_indices, torch.Tensor) else torch.tensor(kv_indices, dtype=torch.int64)
            _check_indptr(kvp, "kv_indptr", B + 1, idx_all.numel(), "the length of kv_indices")
            used = idx_all[kvp[0]:kvp[-1]]
            bad = ((used < 0) | (used >= rows_in_cache)).nonzero()
            if bad.numel():
                i = int(bad[0])
                raise ValueError(f"reference_decode: kv_indices[{kvp[0] + i}] = {int(used[i])} is not a row of the "
                                 f"cache ({rows_in_cache} rows)")
        else:
            _check_indptr(kvp, "kv_indptr", B + 1, rows_in_cache, "the cache's rows")

    out = torch.zeros((total_q, H, v_dim), dtype=torch.float64, device=cdev)
    lse = torch.full((total_q, H), -math.inf, dtype=torch.float64, device=cdev)

    for b in range(B):
        q0, q1 = qo[b], qo[b + 1]
        nq = q1 - q0
        if nq <= 0:
            continue
        if paged:
            L = lens[b]
            j = torch.arange(L, dtype=torch.int64)
            rows = table[b, j // page_size] * page_size + j % page_size if L > 0 else j
        else:
            L = kvp[b + 1] - kvp[b]
            rows = torch.arange(kvp[b], kvp[b + 1], dtype=torch.int64)
            if idx_all is not None:
                rows = idx_all[rows]
        if L <= 0:
            continue
        k = kv[rows.to(kv.device)].to(device=cdev, dtype=torch.float64)        # (L, D)
        qb = q[q0:q1].to(device=cdev, dtype=torch.float64)                     # (nq, H, D)
        s = torch.einsum("qhd,ld->qhl", qb, k) * float(sm_scale)               # (nq, H, L)
        if nq > 1:
            i = torch.arange(nq, device=cdev).view(nq, 1, 1)
            jj = torch.arange(L, device=cdev).view(1, 1, L)
            s = s.masked_fill(jj >= (L - nq + i + 1), -math.inf)
        l = torch.logsumexp(s, dim=-1)                                         # (nq, H)
        seen = torch.isfinite(l)
        p = torch.where(seen.unsqueeze(-1), torch.exp(s - l.unsqueeze(-1)), torch.zeros_like(s))
        out[q0:q1] = torch.einsum("qhl,ld->qhd", p, k[:, :v_dim])
        lse[q0:q1] = torch.where(seen, l, torch.full_like(l, -math.inf))
    return out, lse


def reference_custom_kernel(data, kv_format: str = "bf16") -> torch.Tensor:
    """``custom_kernel(data)`` evaluated with :func:`reference_decode` (float64 math).

    Reads ``kv_data[kv_format]`` ("bf16" by default, or "fp8" / "mxfp4"), returns bf16
    ``(total_q, H, v_head_dim)`` on q's device.  Slow; a correctness fallback only.
    """
    if not isinstance(data, (tuple, list)) or len(data) != 5:
        raise ValueError("reference_custom_kernel: data must be (q, kv_data, qo_indptr, kv_indptr, config)")
    q, kv_data, qo_indptr, kv_indptr, config = data
    if not isinstance(kv_data, dict) or kv_format not in kv_data:
        keys = sorted(map(str, kv_data)) if isinstance(kv_data, dict) else type(kv_data).__name__
        raise ValueError(f"reference_custom_kernel: kv_data has no {kv_format!r} entry (it holds {keys})")
    if not isinstance(config, dict) or "sm_scale" not in config:
        raise ValueError("reference_custom_kernel: config must be a dict with 'sm_scale'")
    entry = kv_data[kv_format]
    if kv_format == "bf16":
        kv_rows = dequantize_cache(entry)
    else:
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"reference_custom_kernel: kv_data[{kv_format!r}] must be a (cache, scale) pair")
        kv_rows = dequantize_cache(entry[0], entry[1])
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("reference_custom_kernel: q (data[0]) must be a (total_q, H, 576) tensor")
    qo = _to_list(qo_indptr, "qo_indptr")
    # As strict as the operator: every query row belongs to an item.
    if not qo or qo[0] != 0 or qo[-1] != q.shape[0]:
        raise ValueError(f"reference_custom_kernel: qo_indptr must run from 0 to q.size(0) = {q.shape[0]}, but it "
                         f"runs from {qo[0] if qo else None} to {qo[-1] if qo else None}")
    out, _ = reference_decode(q, kv_rows, qo_indptr, float(config["sm_scale"]),
                              kv_indptr=kv_indptr, v_dim=int(config.get("v_head_dim", _V_DIM)))
    return out.to(torch.bfloat16).to(q.device)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref||_F / ||ref||_F`` in float64 (on CPU).

    NaN-aware: positions where both are NaN (or both the same infinity) count as equal;
    a NaN / inf in one but not the other gives ``inf``.  If ``ref`` is all zero, returns
    0.0 when ``out`` is too, else ``inf``.
    """
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch {tuple(o.shape)} vs {tuple(r.shape)}")
    o_bad = ~torch.isfinite(o)
    r_bad = ~torch.isfinite(r)
    same_special = o_bad & r_bad & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    if bool(((o_bad | r_bad) & ~same_special).any()):
        return math.inf
    o = torch.where(same_special, torch.zeros_like(o), o)
    r = torch.where(same_special, torch.zeros_like(r), r)
    num = torch.linalg.vector_norm(o - r).item()
    den = torch.linalg.vector_norm(r).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den
