"""Input generation for the ``custom_kernel(data)`` interface.

:func:`generate_input` reproduces the problem's ``generate_input`` (gpu-mode/reference-kernels,
problems/amd_202602/mixed-mla/reference.py): one ``torch.Generator`` on the device seeded
with ``seed``; ``q`` drawn first, then the bf16 cache, both with ``torch.randn`` in bf16; fp8
and MXFP4 derived from the bf16 cache; uniform int32 indptrs.  On the same backend
(device type) and torch build, the same call gives the same bytes.  CPU and CUDA generators
draw different streams, so CPU inputs are only self-consistent, not the competition's.

Helpers for ragged / indexed / paged cases used by the tests:
:func:`make_ragged_indptr`, :func:`random_lengths`, :func:`generate_ragged_input`,
:func:`make_paged_cache`.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple, Union

import torch

from .quant import E8M0_DTYPE, FP4_DTYPE, quantize_fp8, quantize_mxfp4

__all__ = [
    "NUM_HEADS", "NUM_KV_HEADS", "KV_LORA_RANK", "QK_ROPE_HEAD_DIM", "QK_HEAD_DIM",
    "V_HEAD_DIM", "SM_SCALE",
    "default_device", "make_config", "quantize_cache", "generate_input",
    "make_ragged_indptr", "random_lengths", "generate_ragged_input", "make_paged_cache",
]

NUM_HEADS = 16
NUM_KV_HEADS = 1
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM   # 576
V_HEAD_DIM = KV_LORA_RANK                        # 512
SM_SCALE = 1.0 / (QK_HEAD_DIM ** 0.5)           # exactly 1/24

DeviceLike = Union[str, torch.device, None]


def default_device(device: DeviceLike = None) -> torch.device:
    """``device`` or, when None, "cuda" if available else "cpu"."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def make_config(batch_size: int, q_seq_len: int, kv_seq_len: int,
                num_heads: int = NUM_HEADS) -> Dict:
    return {
        "batch_size": batch_size,
        "num_heads": num_heads,
        "num_kv_heads": NUM_KV_HEADS,
        "qk_head_dim": QK_HEAD_DIM,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": V_HEAD_DIM,
        "q_seq_len": q_seq_len,
        "kv_seq_len": kv_seq_len,
        "sm_scale": SM_SCALE,
    }


def quantize_cache(
    kv_bf16: torch.Tensor,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    native_mx_dtypes: bool = True,
    scale_pad: Union[bool, str] = False,
    variant: str = "aiter",
) -> Dict:
    """The ``kv_data`` dict for a bf16 cache ``(total_kv, 1, 576)``.

    ``native_mx_dtypes``: MXFP4 data as ``torch.float4_e2m1fn_x2`` and scales as
    ``torch.float8_e8m0fnu`` when this torch has them (as aiter returns them), else uint8.
    ``variant="nearest"`` uses the pure-PyTorch reference revision's quantiser (uint8 data,
    E8M0 scales).
    """
    kv_fp8, kv_scale = quantize_fp8(kv_bf16, fp8_dtype)
    if variant == "aiter":
        fp4_dt = FP4_DTYPE if (native_mx_dtypes and FP4_DTYPE is not None) else torch.uint8
        sc_dt = E8M0_DTYPE if (native_mx_dtypes and E8M0_DTYPE is not None) else torch.uint8
        kv_fp4, kv_e8m0 = quantize_mxfp4(kv_bf16, fp4_dtype=fp4_dt, scale_dtype=sc_dt,
                                         scale_pad=scale_pad, method="aiter")
    elif variant == "nearest":
        kv_fp4, kv_e8m0 = quantize_mxfp4(kv_bf16, scale_pad=scale_pad, method="nearest")
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return {"bf16": kv_bf16, "fp8": (kv_fp8, kv_scale), "mxfp4": (kv_fp4, kv_e8m0)}


def generate_input(
    batchsize: int,
    qseqlen: int,
    kvseqlen: int,
    seed: int,
    device: DeviceLike = None,
    num_heads: int = NUM_HEADS,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    native_mx_dtypes: bool = True,
    scale_pad: Union[bool, str] = False,
    variant: str = "aiter",
):
    """The competition tuple ``(q, kv_data, qo_indptr, kv_indptr, config)``.

    * ``q``: ``(batchsize*qseqlen, num_heads, 576)`` bf16, ``torch.randn`` from the seeded
      device generator (drawn first);
    * ``kv_data["bf16"]``: ``(batchsize*kvseqlen, 1, 576)`` bf16, drawn second;
      ``kv_data["fp8"] = (kv_fp8, scale (1,) fp32)``;
      ``kv_data["mxfp4"] = (kv_fp4 (total_kv, 1, 288), scale_e8m0 (total_kv, 18))``;
    * ``qo_indptr = arange(B+1)*qseqlen``, ``kv_indptr = arange(B+1)*kvseqlen``, int32;
    * ``config`` as in interface.md (``sm_scale = 1/24``).

    ``variant="aiter"`` (default) follows interface.md: plain ``randn`` and aiter's MXFP4
    quantiser.  ``variant="nearest"`` follows the later pure-PyTorch revision of the
    problem's reference: both tensors are ``randn(...) * 0.02`` (bf16 multiply) and MXFP4
    uses its quantiser.  ``fp8_dtype``: e4m3fn (MI355X / NVIDIA) or e4m3fnuz (MI300).
    """
    dev = default_device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    total_q = batchsize * qseqlen
    total_kv = batchsize * kvseqlen
    q = torch.randn((total_q, num_heads, QK_HEAD_DIM), dtype=torch.bfloat16,
                    device=dev, generator=gen)
    if variant == "nearest":
        q = q * 0.02
    kv = torch.randn((total_kv, NUM_KV_HEADS, QK_HEAD_DIM), dtype=torch.bfloat16,
                     device=dev, generator=gen)
    if variant == "nearest":
        kv = kv * 0.02
    kv_data = quantize_cache(kv, fp8_dtype=fp8_dtype, native_mx_dtypes=native_mx_dtypes,
                             scale_pad=scale_pad, variant=variant)
    qo_indptr = torch.arange(0, batchsize + 1, dtype=torch.int32, device=dev) * qseqlen
    kv_indptr = torch.arange(0, batchsize + 1, dtype=torch.int32, device=dev) * kvseqlen
    config = make_config(batchsize, qseqlen, kvseqlen, num_heads)
    return q, kv_data, qo_indptr, kv_indptr, config


# ---------------------------------------------------------------------------------------
# Ragged / paged helpers
# ---------------------------------------------------------------------------------------

def make_ragged_indptr(lengths: Sequence[int], device: DeviceLike = None) -> torch.Tensor:
    """int32 ``[0, l0, l0+l1, ...]`` (length ``len(lengths)+1``) on ``device`` (default cpu)."""
    lens = [int(x) for x in lengths]
    if any(x < 0 for x in lens):
        raise ValueError("lengths must be >= 0")
    out = [0]
    for x in lens:
        out.append(out[-1] + x)
    return torch.tensor(out, dtype=torch.int32, device=torch.device(device or "cpu"))


def random_lengths(batch: int, max_len: int, seed: int, min_len: int = 0,
                   zero_frac: float = 0.0) -> list:
    """Deterministic random lengths in ``[min_len, max_len]``; about ``zero_frac`` of them
    forced to 0 (CPU generator, independent of the device)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (batch,), generator=g)
    if zero_frac > 0:
        z = torch.rand((batch,), generator=g) < zero_frac
        lens = torch.where(z, torch.zeros_like(lens), lens)
    return [int(v) for v in lens.tolist()]


def generate_ragged_input(
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
    seed: int,
    device: DeviceLike = None,
    num_heads: int = NUM_HEADS,
    **quant_kwargs,
):
    """Like :func:`generate_input` with per-item query / KV lengths (zeros allowed).

    ``config["q_seq_len"]`` / ``["kv_seq_len"]`` are the maxima; the indptrs are the truth.
    """
    if len(q_lens) != len(kv_lens):
        raise ValueError("q_lens and kv_lens must have the same length")
    dev = default_device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    total_q, total_kv = int(sum(q_lens)), int(sum(kv_lens))
    q = torch.randn((total_q, num_heads, QK_HEAD_DIM), dtype=torch.bfloat16,
                    device=dev, generator=gen)
    kv = torch.randn((total_kv, NUM_KV_HEADS, QK_HEAD_DIM), dtype=torch.bfloat16,
                     device=dev, generator=gen)
    kv_data = quantize_cache(kv, **quant_kwargs)
    config = make_config(len(q_lens), max(q_lens, default=0), max(kv_lens, default=0), num_heads)
    return (q, kv_data, make_ragged_indptr(q_lens, dev), make_ragged_indptr(kv_lens, dev), config)


def make_paged_cache(
    kv_rows: torch.Tensor,
    kv_indptr: torch.Tensor,
    page_size: int,
    seed: int = 0,
    extra_pages: int = 0,
    fill: float = float("nan"),
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scatter a contiguous cache into shuffled pages.

    ``kv_rows``: ``(total_kv, ...)`` (any dtype); item b owns rows
    ``[kv_indptr[b], kv_indptr[b+1])``.  Returns ``(pages, block_table, kv_lens)``:
    ``pages`` ``(num_pages, page_size, ...)`` where token j of item b is
    ``pages[block_table[b, j // page_size], j % page_size]``; unused slots (the tail of each
    item's last page and ``extra_pages`` spare pages) hold ``fill`` (NaN for float caches,
    0xFF-ish for byte caches) so a reader that touches them shows it.  ``block_table`` is int32
    ``(B, max_pages)`` padded with -1; ``kv_lens`` int32 ``(B,)``.  All on kv_rows' device.
    """
    ptr = [int(v) for v in kv_indptr.cpu().tolist()]
    lens = [ptr[i + 1] - ptr[i] for i in range(len(ptr) - 1)]
    npages = [-(-n // page_size) for n in lens]
    total_pages = sum(npages) + extra_pages
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    perm = torch.randperm(max(total_pages, 1), generator=g)[:total_pages].tolist()
    dev = kv_rows.device
    tail = tuple(kv_rows.shape[1:])
    pages = torch.empty((total_pages, page_size) + tail, dtype=kv_rows.dtype, device=dev)
    if kv_rows.is_floating_point() and kv_rows.element_size() > 1:
        pages.fill_(fill)
    else:
        pages.view(torch.uint8).fill_(0xFF) if pages.element_size() == 1 else pages.fill_(-1)
    max_pages = max(npages, default=0)
    table = torch.full((len(lens), max(max_pages, 1)), -1, dtype=torch.int32)
    nxt = 0
    flat = pages.view((total_pages * page_size,) + tail)
    for b, n in enumerate(lens):
        for p in range(npages[b]):
            phys = perm[nxt]
            nxt += 1
            table[b, p] = phys
            j0 = p * page_size
            cnt = min(page_size, n - j0)
            flat[phys * page_size: phys * page_size + cnt] = kv_rows[ptr[b] + j0: ptr[b] + j0 + cnt]
    return pages, table.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev)
