"""KV-cache quantisers and dequantisers: per-tensor FP8 and OCP MXFP4 (E2M1 + E8M0).

These are exact, deterministic, pure-PyTorch implementations of the formats in
``docs/formats.md`` (and ``interface.md``).  They work on CPU and CUDA tensors, never call
``.item()`` and never synchronise with the host.

* :func:`quantize_fp8` / :func:`dequantize_fp8` - per-tensor FP8 (e4m3fn, max 448, or
  e4m3fnuz, max 240), same op sequence as the problem's ``quantize_fp8``.
* :func:`quantize_mxfp4` / :func:`dequantize_mxfp4` - MXFP4 with 32-element blocks.  The
  default ``method="aiter"`` reproduces aiter's ``dynamic_mxfp4_quant`` bit for bit
  ("even" E8M0 rounding of the block amax, E2M1 round-to-nearest-even, saturation at 6);
  ``method="nearest"`` reproduces the pure-PyTorch quantiser that a later revision of the
  problem's reference used (E8M0 scale = torch's cast of ``amax / 6``, nearest level with
  ties to the lower level).  Both emit the same byte layout.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

__all__ = [
    "E2M1_VALUES",
    "MX_BLOCK",
    "FP4_DTYPE",
    "E8M0_DTYPE",
    "fp8_max",
    "quantize_fp8",
    "dequantize_fp8",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "e8m0_to_float",
    "e2m1_decode",
    "mxfp4_unpack_codes",
]

MX_BLOCK = 32
#: Value of E2M1 code 0..15 (bit 3 = sign, bits 0-2 = magnitude index).  Code 8 is -0.0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

#: torch's packed fp4 / E8M0 dtypes when this torch has them, else None.
FP4_DTYPE = getattr(torch, "float4_e2m1fn_x2", None)
E8M0_DTYPE = getattr(torch, "float8_e8m0fnu", None)

# Rows processed per chunk by the MXFP4 quantiser (bounds the fp32 temporaries).
_CHUNK_ROWS = 1 << 16


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a 1-byte tensor (uint8 / int8 / fp4x2 / e8m0 / fp8) as uint8, keeping strides."""
    if t.dtype == torch.uint8:
        return t
    if t.element_size() != 1:
        raise TypeError(f"expected a 1-byte dtype, got {t.dtype}")
    return t.view(torch.uint8)


# ---------------------------------------------------------------------------------------
# FP8, per tensor
# ---------------------------------------------------------------------------------------

def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 240 for e4m3fnuz)."""
    return float(torch.finfo(dtype).max)


def quantize_fp8(
    kv: torch.Tensor,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 quantisation.

    Same op sequence as the problem's ``quantize_fp8`` (so the same bits on the same
    backend), all arithmetic in ``kv.dtype`` (bf16 for the competition cache):

        amax  = max(|kv|) clamped to >= 1e-12      (zero guard: an all-zero tensor gets a
                                                   tiny positive scale and all-zero codes;
                                                   the scale is never 0, never NaN)
        scale = amax / finfo(dtype).max            (in kv.dtype, then cast to fp32)
        code  = clamp(kv / scale, -max, max).to(dtype)

    Returns ``(kv_fp8, scale)``: ``kv_fp8`` has kv's shape, ``scale`` is float32 of shape
    ``(1,)`` on kv's device.  Dequantised value = ``code * scale``.
    """
    if dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz,
                     torch.float8_e5m2, torch.float8_e5m2fnuz):
        raise TypeError(f"quantize_fp8: unsupported fp8 dtype {dtype}")
    finfo = torch.finfo(dtype)
    amax = kv.abs().amax().clamp(min=1e-12)
    scale = amax / finfo.max
    kv_fp8 = (kv / scale).clamp(min=finfo.min, max=finfo.max).to(dtype)
    return kv_fp8, scale.to(torch.float32).reshape(1)


def dequantize_fp8(
    kv_fp8: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``code * scale`` in ``dtype`` (float32 by default; pass float64 for the exact product)."""
    s = scale.to(device=kv_fp8.device, dtype=dtype).reshape(-1)
    if s.numel() != 1:
        raise ValueError(f"dequantize_fp8: per-tensor scale must have one element, got {tuple(scale.shape)}")
    return kv_fp8.to(dtype) * s


# ---------------------------------------------------------------------------------------
# MXFP4
# ---------------------------------------------------------------------------------------

def _pow2_f32(exp: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**exp for integer exp in [-149, 127], built from bits (int32 in)."""
    exp = exp.to(torch.int32)
    normal = (exp + 127).clamp(min=0) << 23                      # exp >= -126
    sub = torch.ones_like(exp) << (exp + 149).clamp(min=0, max=22)  # -149 <= exp < -126
    bits = torch.where(exp >= -126, normal, sub)
    return bits.view(torch.float32)


def _e2m1_code_rne(m: torch.Tensor) -> torch.Tensor:
    """Magnitude index 0..7 of the nearest E2M1 value to m >= 0 (ties to even), saturating.

    Thresholds are the midpoints between consecutive E2M1 values; at a midpoint the even
    index wins (0.25->0, 0.75->2, 1.25->2, 1.75->4, 2.5->4, 3.5->6, 5->6).  Comparisons
    on float32 are exact, so this equals IEEE round-to-nearest-even onto the E2M1 grid
    (what aiter's bit-trick conversion computes).  NaN maps to 0 (NaN input unsupported).
    """
    c = (m > 0.25).to(torch.uint8)
    c += m >= 0.75
    c += m > 1.25
    c += m >= 1.75
    c += m > 2.5
    c += m >= 3.5
    c += m > 5.0
    return c


def _mx_scale_exponent_even(amax: torch.Tensor) -> torch.Tensor:
    """aiter "even" rule: unbiased E8M0 exponent (int32) for fp32 block amax >= 0.

    bits(amax) + 0x200000, masked with 0xFF800000 (round the amax up to the next power
    of two when its mantissa is >= 1.75), e = floor(log2(that)) - 2, clamped to
    [-127, 127].  A zero (or subnormal-rounding-to-zero) amax gives log2(0) = -inf, i.e.
    e = -127; an infinite amax gives +127.
    """
    bits = amax.view(torch.int32).to(torch.int64)
    rounded = (bits + 0x200000) & 0x7F800000     # sign is 0 for amax >= 0
    field = rounded >> 23                         # biased exponent of the power of two
    e = torch.where(field == 255, torch.full_like(field, 129), field) - 129
    return e.clamp(min=-127, max=127).to(torch.int32)


def _pack_nibbles(nib: torch.Tensor) -> torch.Tensor:
    """(rows, D) uint8 nibbles -> (rows, D/2) bytes, even element in the low nibble."""
    return nib[:, 0::2] | (nib[:, 1::2] << 4)


def _quant_chunk_aiter(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    rows, d = x.shape
    xb = x.to(torch.float32).reshape(rows, d // MX_BLOCK, MX_BLOCK)
    sign = (xb.view(torch.int32) < 0).to(torch.uint8) << 3      # includes -0.0, like aiter
    amax = xb.abs().amax(dim=-1)
    e = _mx_scale_exponent_even(amax)                           # (rows, nb) int32
    m = xb.abs() * _pow2_f32(-e).unsqueeze(-1)                  # exact (power-of-two scale)
    nib = (_e2m1_code_rne(m) | sign).reshape(rows, d)
    return _pack_nibbles(nib), (e + 127).to(torch.uint8)


_LUT_CACHE: dict = {}


def _e2m1_lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The 16 E2M1 values as a tensor on ``device``, built there from the code bits
    (no host-to-device copy, so no synchronisation), cached per (device, dtype)."""
    key = (str(device), dtype)
    lut = _LUT_CACHE.get(key)
    if lut is None:
        c = torch.arange(16, dtype=torch.int32, device=device)
        e = (c >> 1) & 3
        m = (c & 1).to(dtype)
        mag = torch.where(e == 0, m * 0.5, (1.0 + 0.5 * m) * torch.exp2((e - 1).to(dtype)))
        lut = torch.where((c & 8) != 0, -mag, mag)   # -0.0 for code 8
        _LUT_CACHE[key] = lut
    return lut


def _quant_chunk_nearest(x: torch.Tensor):
    """Pure-PyTorch variant (later problem revision): scale = E8M0 cast of amax/6,
    code = nearest level (ties to the lower level), sign from ``normalised < 0``."""
    rows, d = x.shape
    xb = x.to(torch.float32).reshape(rows, d // MX_BLOCK, MX_BLOCK)
    amax = xb.abs().amax(dim=-1).clamp(min=1e-12)
    scale = (amax / 6.0).clamp(min=1e-12)
    if E8M0_DTYPE is not None:
        scale_q = scale.to(E8M0_DTYPE)
        scale_f = scale_q.to(torch.float32)
    else:  # very old torch: float32 scales (what that reference does too)
        scale_q = scale
        scale_f = scale
    v = xb / scale_f.unsqueeze(-1)
    levels = _e2m1_lut(x.device, torch.float32)[:8]
    code = (v.abs().unsqueeze(-1) - levels).abs().argmin(dim=-1).to(torch.uint8)
    nib = (code | ((v < 0).to(torch.uint8) << 3)).reshape(rows, d)
    return _pack_nibbles(nib), scale_q


def quantize_mxfp4(
    kv: torch.Tensor,
    *,
    fp4_dtype: Optional[torch.dtype] = torch.uint8,
    scale_dtype: Optional[torch.dtype] = torch.uint8,
    scale_pad: Union[bool, str] = False,
    pad_fill: Union[int, str] = 0xFF,
    method: str = "aiter",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """OCP MXFP4 quantisation along the last dim (blocks of 32).

    Args:
        kv: ``(..., D)`` float tensor (bf16 / fp16 / fp32; float64 is rounded to fp32
            first), ``D % 32 == 0`` (576 for the MLA cache).
        fp4_dtype: dtype of the packed data, ``torch.uint8`` (default) or
            ``torch.float4_e2m1fn_x2`` (a view of the same bytes).
        scale_dtype: ``torch.uint8`` (default) or ``torch.float8_e8m0fnu`` (same bytes).
        scale_pad: ``False`` -> contiguous ``(rows, D/32)`` scales.  ``True`` -> the full
            padded buffer ``(ceil(rows/256)*256, ceil(D/256)*8)`` (24 columns for D=576),
            real data in rows ``0..rows-1``, cols ``0..D/32-1``.  ``"view"`` -> the
            ``(rows, D/32)`` slice of that padded buffer (row stride 24).
        pad_fill: byte written to the padding (default 0xFF = E8M0 NaN), or ``"random"``
            for deterministic pseudo-random bytes.
        method: ``"aiter"`` (default; the contract's quantiser) or ``"nearest"`` (the
            pure-PyTorch reference revision; its scales come back as E8M0 unless this
            torch lacks the dtype, in which case float32; ``scale_dtype`` is ignored).

    Returns ``(kv_fp4, scale_e8m0)``: ``kv_fp4`` ``(..., D/2)`` bytes, two E2M1 codes per
    byte, even element in the low nibble, sign in bit 3 of each nibble; ``scale_e8m0`` 2-D,
    one biased exponent per block (value 2**(byte-127)).  ``rows`` = product of the
    leading dims of ``kv``.
    """
    if kv.dim() < 1 or kv.shape[-1] % MX_BLOCK != 0:
        raise ValueError(f"quantize_mxfp4: last dim must be a multiple of 32, got {tuple(kv.shape)}")
    if not kv.is_floating_point():
        raise TypeError(f"quantize_mxfp4: expected a float tensor, got {kv.dtype}")
    if method not in ("aiter", "nearest"):
        raise ValueError(f"quantize_mxfp4: unknown method {method!r}")
    lead = tuple(kv.shape[:-1])
    d = kv.shape[-1]
    nb = d // MX_BLOCK
    rows = math.prod(lead)
    x2 = kv.reshape(rows, d)
    dev = kv.device

    packed = torch.empty((rows, d // 2), dtype=torch.uint8, device=dev)
    if method == "aiter":
        scales = torch.empty((rows, nb), dtype=torch.uint8, device=dev)
        fn = _quant_chunk_aiter
    else:
        sdt = E8M0_DTYPE if E8M0_DTYPE is not None else torch.float32
        scales = torch.empty((rows, nb), dtype=sdt, device=dev)
        fn = _quant_chunk_nearest
    for r0 in range(0, rows, _CHUNK_ROWS):
        r1 = min(rows, r0 + _CHUNK_ROWS)
        p, s = fn(x2[r0:r1])
        packed[r0:r1] = p
        scales[r0:r1] = s

    if method == "nearest":
        scale_dtype = None  # keep as produced
    if scale_pad:
        scales = _pad_scales(scales, rows, nb, pad_fill, view=(scale_pad == "view"))

    kv_fp4 = packed.reshape(*lead, d // 2)
    if fp4_dtype is not None and fp4_dtype != torch.uint8:
        kv_fp4 = kv_fp4.view(fp4_dtype)
    if scale_dtype is not None and scale_dtype != scales.dtype:
        scales = scales.view(scale_dtype)
    return kv_fp4, scales


def _pad_scales(scales, rows, nb, pad_fill, view):
    rows_pad = max(256, -(-rows // 256) * 256)
    cols_pad = -(-nb // 8) * 8
    dev = scales.device
    if pad_fill == "random":
        g = torch.Generator(device=dev)
        g.manual_seed(0x5EED)
        buf = torch.randint(0, 256, (rows_pad, cols_pad), dtype=torch.uint8, device=dev, generator=g)
    else:
        buf = torch.full((rows_pad, cols_pad), int(pad_fill), dtype=torch.uint8, device=dev)
    if scales.dtype != torch.uint8:
        if scales.element_size() != 1:
            raise TypeError("scale padding needs 1-byte scales")
        buf = buf.view(scales.dtype)
    buf[:rows, :nb] = scales
    return buf[:rows, :nb] if view else buf


def e8m0_to_float(scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exact 2**(byte-127) for E8M0 bytes (uint8 or float8_e8m0fnu); 0xFF -> NaN.

    Byte 0 is 2**-127, a float32 subnormal, built exactly from bits.  Float scale tensors
    (float32 scales of the "nearest" quantiser on a torch without E8M0) pass through.
    """
    if scale.is_floating_point() and scale.element_size() != 1:
        return scale.to(dtype)
    b = _byte_view(scale).to(torch.int32)
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23)
    bits = torch.where(b == 255, torch.full_like(b, 0x7FC00000), bits)
    return bits.view(torch.float32).to(dtype)


def mxfp4_unpack_codes(kv_fp4: torch.Tensor) -> torch.Tensor:
    """``(..., P)`` packed bytes -> ``(..., 2P)`` uint8 codes 0..15 (low nibble first)."""
    u = _byte_view(kv_fp4)
    return torch.stack((u & 0xF, u >> 4), dim=-1).reshape(*u.shape[:-1], 2 * u.shape[-1])


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E2M1 code (0..15) -> value."""
    return _e2m1_lut(codes.device, dtype)[codes.long()]


def dequantize_mxfp4(
    kv_fp4: torch.Tensor,
    scale_e8m0: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """MXFP4 -> ``(..., 2P)`` values in ``dtype`` (float32 by default).

    ``kv_fp4`` is ``(..., P)`` bytes (uint8 or float4_e2m1fn_x2); ``rows`` is the product
    of its leading dims.  ``scale_e8m0`` is 2-D and read through its strides: rows
    ``0..rows-1``, columns ``0..2P/32-1`` (extra rows / columns / padding are ignored).
    Every product E2M1 value x 2**k is exact in float32 (subnormals included); 0xFF scales
    give NaN for their whole block.
    """
    u = _byte_view(kv_fp4)
    lead = tuple(u.shape[:-1])
    d = 2 * u.shape[-1]
    if d % MX_BLOCK != 0:
        raise ValueError(f"dequantize_mxfp4: unpacked width {d} is not a multiple of 32")
    nb = d // MX_BLOCK
    rows = math.prod(lead)
    s = scale_e8m0
    if s.dim() == 1 and rows == 1:
        s = s.unsqueeze(0)
    if s.dim() != 2:
        raise ValueError(f"dequantize_mxfp4: scale must be 2-D, got shape {tuple(s.shape)}")
    if s.shape[0] < rows or s.shape[1] < nb:
        raise ValueError(
            f"dequantize_mxfp4: scale {tuple(s.shape)} too small for {rows} rows x {nb} blocks")
    sf = e8m0_to_float(s[:rows, :nb], dtype)                  # strided read
    vals = e2m1_decode(mxfp4_unpack_codes(u.reshape(rows, d // 2)), dtype)
    out = vals.reshape(rows, nb, MX_BLOCK) * sf.to(vals.device).unsqueeze(-1)
    return out.reshape(*lead, d)
