"""The package's built-in check: decode cases against a float64 reference, needing
nothing but torch (no repository, no test files).

    python -m mla_decode check            # the operator and custom_kernel, CPU and GPU

Two kinds of case, each on the CPU and, when one is visible, on the GPU:

* operator cases: torch.ops.mla_decode.decode on every cache format (bf16, fp8
  e4m3fn, fp8 e4m3fnuz, MXFP4) and addressing layout (indptr, indices, paged),
  ragged lengths with an empty item, two query tokens per item (the causal
  mask); every cache row no token references holds the format's NaN, so a
  kernel that reads a wrong row fails. On a GPU also shapes large enough for
  the Hopper kernels (H = 128; long single sequences at H = 16).
* custom_kernel cases: the competition tuple (q, kv_data, qo_indptr, kv_indptr,
  config) in each format (MLA_DECODE_FORMAT), equal and ragged lengths, the
  MXFP4 scales padded as the contract allows; the output must be a new
  (total_q, H, 512) bf16 tensor.

Each output is compared with float64 math on the dequantised cache that the
kernel read, so the format's own quantisation error cancels and the bounds are
the kernel's arithmetic (see REL_FRO_TOL). The quantisers, dequantisers and the
reference here are written independently of mla_decode.quant and
mla_decode.reference, so the check also cross-checks those.

This file imports only torch and the standard library: the single-file
submission (python -m mla_decode.submission) embeds it, and `python
submission.py --check` runs these same cases on the submission in a process
that never imports mla_decode.
"""

from __future__ import annotations

import math
import os
import time

import torch

D_QK, D_V = 576, 512
SM_SCALE = 1.0 / math.sqrt(D_QK)

# Bounds from the arithmetic, not from observed results: the reference reads the same
# dequantised values as the kernel, so what remains is bf16 rounding of the output (2^-9
# relative per element, ~1.1e-3 RMS), bf16 rounding of the probabilities on the GPU (same
# order) and fp32 accumulation. 8e-3 is ~3x that budget and ~2x below fp8's own quantisation
# error, so a wrong dequantisation, scale or row fails.
REL_FRO_TOL = 8e-3
LSE_ABS_TOL = 2e-3

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP8 = {"fp8": (torch.float8_e4m3fn, 448.0, 0x7F), "fp8_fnuz": (torch.float8_e4m3fnuz, 240.0, 0x80)}
_FP4_DTYPE = getattr(torch, "float4_e2m1fn_x2", None)
_E8M0_DTYPE = getattr(torch, "float8_e8m0fnu", None)
OPERATOR_FORMATS = ("bf16", "fp8", "fp8_fnuz", "mxfp4")
LAYOUTS = ("indptr", "indices", "paged")
COMPETITION_FORMATS = ("mxfp4", "fp8", "bf16")


# ---- formats ---------------------------------------------------------------------------------

def quantize_fp8(rows_bf16: torch.Tensor, fmt: str = "fp8"):
    """(n, 576) bf16 -> (codes (n, 576), scale float32 (1,)): per-tensor amax / max code."""
    dtype, top, _ = _FP8[fmt]
    scale = (rows_bf16.abs().max() / top).float().reshape(1)
    codes = (rows_bf16.float() / scale).clamp(-top, top).to(dtype)
    return codes, scale


def quantize_mxfp4(rows_bf16: torch.Tensor):
    """(n, 576) bf16 -> (packed (n, 288) uint8, E8M0 scales (n, 18) uint8).

    Blocks of 32 along the row; scale 2^e with the smallest e that brings the block's largest
    magnitude within E2M1's 6; each element rounded to the nearest E2M1 value; two codes per
    byte, the even element in the low nibble."""
    n = rows_bf16.shape[0]
    x = rows_bf16.float().reshape(n, D_QK // 32, 32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    e = torch.ceil(torch.log2(amax.clamp_min(2.0 ** -120) / 6.0)).clamp(-127, 127)
    y = x * torch.exp2(-e)
    # Magnitude codes 0..7 by the midpoints between E2M1's values.
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device)
    idx = torch.bucketize(y.abs().clamp(max=6.0).contiguous(), mids)
    codes = (idx | ((y < 0) & (idx > 0)).to(idx.dtype) * 8).to(torch.uint8).reshape(n, D_QK)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = (e.reshape(n, D_QK // 32) + 127).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()


def dequantize(cache: torch.Tensor, scale, fmt: str) -> torch.Tensor:
    """Any of the formats -> float64 (rows, 576), token rows flattened."""
    if fmt == "bf16":
        return cache.reshape(-1, D_QK).to(torch.float64)
    if fmt in _FP8:
        return cache.reshape(-1, D_QK).to(torch.float64) * scale.to(torch.float64)
    packed = cache.reshape(-1, D_QK // 2).view(torch.uint8)
    rows = packed.shape[0]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(rows, D_QK).long()
    table = torch.tensor(_E2M1, dtype=torch.float64, device=cache.device)
    mag = table[codes & 7]
    val = torch.where((codes & 8) != 0, -mag, mag)
    sc = scale.view(torch.uint8)[:rows, :D_QK // 32].to(torch.float64)
    factor = torch.where(sc == 255, torch.full_like(sc, math.nan), torch.exp2(sc - 127))
    return (val.reshape(rows, D_QK // 32, 32) * factor.unsqueeze(-1)).reshape(rows, D_QK)


# ---- reference -------------------------------------------------------------------------------

def reference(q: torch.Tensor, rows64: torch.Tensor, qo: list, items: list):
    """Float64 decode: items[b] is the list (or tensor) of cache rows item b attends, in order;
    query rows qo[b]:qo[b+1]. Bottom-right causal mask with several queries per item. Returns
    (out (total_q, H, 512), lse (total_q, H)); a query that sees no key: 0 and -inf."""
    total_q, heads, _ = q.shape
    out = torch.zeros(total_q, heads, D_V, dtype=torch.float64, device=rows64.device)
    lse = torch.full((total_q, heads), -math.inf, dtype=torch.float64, device=rows64.device)
    for b, rows in enumerate(items):
        q0, q1 = qo[b], qo[b + 1]
        nq, nk = q1 - q0, len(rows)
        if nq == 0 or nk == 0:
            continue
        idx = torch.as_tensor(rows, dtype=torch.long, device=rows64.device)
        k = rows64[idx]
        s = torch.einsum("qhd,kd->qhk", q[q0:q1].to(device=rows64.device, dtype=torch.float64), k) * SM_SCALE
        if nq > 1:
            i = torch.arange(nq, device=k.device).view(nq, 1, 1)
            j = torch.arange(nk, device=k.device).view(1, 1, nk)
            s = s.masked_fill(j >= nk - nq + i + 1, -math.inf)
        m = torch.logsumexp(s, dim=-1)
        seen = torch.isfinite(m)
        p = torch.where(seen.unsqueeze(-1), torch.exp(s - m.unsqueeze(-1)), torch.zeros_like(s))
        out[q0:q1] = torch.einsum("qhk,kd->qhd", p, k[:, :D_V])
        lse[q0:q1] = m
    return out, lse


def compare(out: torch.Tensor, ref_out: torch.Tensor, lse=None, ref_lse=None) -> tuple:
    """(relative Frobenius error, max |lse - ref|) over the queries that see a key; raises
    AssertionError naming what is wrong."""
    o = out.detach().to("cpu", torch.float64)
    r = ref_out.detach().to("cpu", torch.float64)
    if o.shape != r.shape:
        raise AssertionError(f"output shape {tuple(o.shape)}, expected {tuple(r.shape)}")
    if not bool(torch.isfinite(o).all()):
        raise AssertionError("the output has NaN or inf (a reference row that sees keys is always finite)")
    lse_err = 0.0
    if ref_lse is not None:
        rl = ref_lse.detach().to("cpu", torch.float64)
        empty = torch.isinf(rl)
        if not bool((o[empty] == 0).all()):
            raise AssertionError("a query that sees no key must give exact zeros")
        if lse is not None:
            l = lse.detach().to("cpu", torch.float64)
            if not bool((torch.isinf(l[empty]) & (l[empty] < 0)).all()):
                raise AssertionError("a query that sees no key must give lse = -inf")
            if bool((~empty).any()):
                lse_err = float((l[~empty] - rl[~empty]).abs().max())
        o, r = o[~empty], r[~empty]
    den = float(r.norm())
    rel = float((o - r).norm()) / den if den > 0 else float((o - r).norm())
    if rel >= REL_FRO_TOL:
        raise AssertionError(f"relative Frobenius error {rel:.3e} >= {REL_FRO_TOL}")
    if lse_err >= LSE_ABS_TOL:
        raise AssertionError(f"max |lse - reference| = {lse_err:.3e} >= {LSE_ABS_TOL}")
    return rel, lse_err


# ---- operator cases --------------------------------------------------------------------------

def _format_cache(rows_bf16: torch.Tensor, fmt: str):
    """(n, 576) bf16 rows -> (cache (n, 1, D), scale) in fmt; the NaN poisoner for the format."""
    if fmt == "bf16":
        return rows_bf16.unsqueeze(1).contiguous(), None
    if fmt in _FP8:
        codes, scale = quantize_fp8(rows_bf16, fmt)
        return codes.unsqueeze(1).contiguous(), scale
    packed, scales = quantize_mxfp4(rows_bf16)
    return packed.unsqueeze(1).contiguous(), scales


def _poison(cache: torch.Tensor, scale, fmt: str, rows: torch.Tensor) -> None:
    if rows.numel() == 0:
        return
    flat = cache.view(cache.shape[0], -1)
    if fmt == "bf16":
        flat[rows] = float("nan")
    elif fmt in _FP8:
        flat.view(torch.uint8)[rows] = _FP8[fmt][2]
    else:
        scale[rows] = 0xFF


def operator_case(fmt: str, layout: str, heads: int, q_len: int, lengths, seed: int, device,
                  page_size: int = 16):
    """(args of torch.ops.mla_decode.decode, reference out, reference lse)."""
    g = torch.Generator().manual_seed(seed)
    lengths = list(lengths)
    batch, total = len(lengths), sum(lengths)
    q = torch.randn(batch * q_len, heads, D_QK, generator=g).to(torch.bfloat16)
    qo = [b * q_len for b in range(batch + 1)]
    if layout == "paged":
        pages = [-(-n // page_size) for n in lengths]
        n_rows = (sum(pages) + 3) * page_size
    else:
        n_rows = total + 37
    cache, scale = _format_cache(torch.randn(n_rows, D_QK, generator=g).to(torch.bfloat16), fmt)
    kv_indptr = kv_indices = block_table = kv_lens = None
    items = []
    if layout == "indptr":
        start = 5
        offsets = [start]
        for n in lengths:
            items.append(list(range(offsets[-1], offsets[-1] + n)))
            offsets.append(offsets[-1] + n)
        kv_indptr = torch.tensor(offsets, dtype=torch.int32)
    elif layout == "indices":
        perm = torch.randperm(n_rows, generator=g)[:total]
        kv_indices = perm.to(torch.int32)
        ptr = [0]
        for n in lengths:
            items.append(perm[ptr[-1]:ptr[-1] + n].tolist())
            ptr.append(ptr[-1] + n)
        kv_indptr = torch.tensor(ptr, dtype=torch.int32)
    else:
        page_perm = torch.randperm(n_rows // page_size, generator=g).tolist()
        max_pages = max(max(pages), 1) + 1
        table = torch.full((batch, max_pages), 2 ** 30, dtype=torch.int32)   # never read
        k = 0
        for b, n in enumerate(lengths):
            rows = []
            for p in range(pages[b]):
                table[b, p] = page_perm[k]
                first = page_perm[k] * page_size
                rows += list(range(first, first + min(page_size, n - p * page_size)))
                k += 1
            items.append(rows)
        block_table, kv_lens = table, torch.tensor(lengths, dtype=torch.int32)
        cache = cache.view(n_rows // page_size, page_size, 1, cache.shape[-1])
    used = torch.zeros(n_rows, dtype=torch.bool)
    for rows in items:
        used[torch.as_tensor(rows, dtype=torch.long)] = True
    _poison(cache.reshape(n_rows, 1, -1), scale, fmt, (~used).nonzero().flatten())
    ref_out, ref_lse = reference(q, dequantize(cache, scale, fmt), qo, items)

    def dev(t):
        return None if t is None else t.to(device)

    args = (dev(q), dev(cache), dev(scale), torch.tensor(qo, dtype=torch.int32, device=device), dev(kv_indptr),
            dev(kv_indices), dev(block_table), dev(kv_lens), page_size if layout == "paged" else 1, SM_SCALE)
    return args, ref_out, ref_lse


def operator_cases(device: torch.device):
    """(label, fmt, layout, heads, q_len, lengths) of the operator cases on `device`."""
    cases = [(f, lay, 16, 2, [65, 0, 17]) for f in OPERATOR_FORMATS for lay in LAYOUTS]
    if device.type == "cuda":
        # Long single sequences (the narrow Hopper kernels at H < 64), H = 128 (the wide
        # kernel), and one token per item.
        cases += [(f, "indptr", 16, 1, [70000, 3]) for f in OPERATOR_FORMATS]
        cases += [(f, lay, 128, 2, [4100, 0, 300]) for f in OPERATOR_FORMATS for lay in ("indptr", "paged")]
        cases += [(f, "indptr", 128, 1, [8192, 1]) for f in OPERATOR_FORMATS]
    return cases


def check_operator(op, device, log=print) -> tuple:
    """Runs the operator cases through op (torch.ops.mla_decode.decode's signature) on device.
    Returns (passed, failed)."""
    device = torch.device(device)
    passed = failed = 0
    for n, (fmt, layout, heads, q_len, lengths) in enumerate(operator_cases(device)):
        label = f"{device.type:<4} op  {fmt:<8} {layout:<7} H{heads:<3} q{q_len} lens {lengths}"
        try:
            args, ref_out, ref_lse = operator_case(fmt, layout, heads, q_len, lengths, seed=n, device=device)
            out, lse = op(*args, 0)
            rel, lse_err = compare(out, ref_out, lse, ref_lse)
        except Exception as exc:  # noqa: BLE001 - every case reports, the run goes on
            failed += 1
            log(f"FAIL {label}: {type(exc).__name__}: {exc}")
            continue
        passed += 1
        log(f"ok   {label}  rel {rel:.1e}  lse {lse_err:.1e}")
    return passed, failed


# ---- custom_kernel cases ---------------------------------------------------------------------

def competition_input(q_lens, kv_lens, seed: int, device, heads: int = 16, pad_scales: bool = False):
    """The contract's tuple (q, kv_data, qo_indptr, kv_indptr, config), every format derived from
    one bf16 cache; MXFP4 in torch's fp4 / e8m0 dtypes where this torch has them. pad_scales:
    the E8M0 scales with rows padded to a multiple of 256 and a row stride of 24, as allowed."""
    g = torch.Generator().manual_seed(seed)
    total_q, total_kv = sum(q_lens), sum(kv_lens)
    q = torch.randn(total_q, heads, D_QK, generator=g).to(torch.bfloat16)
    kv = torch.randn(total_kv, 1, D_QK, generator=g).to(torch.bfloat16)
    codes, scale = quantize_fp8(kv.reshape(-1, D_QK))
    packed, e8m0 = quantize_mxfp4(kv.reshape(-1, D_QK))
    if pad_scales:
        padded = torch.full((max(256, -(-total_kv // 256) * 256), 24), 127, dtype=torch.uint8)
        padded[:total_kv, :18] = e8m0
        e8m0 = padded[:, :18]
    packed = packed.reshape(total_kv, 1, D_QK // 2)
    if _FP4_DTYPE is not None:
        packed = packed.view(_FP4_DTYPE)
    if _E8M0_DTYPE is not None:
        e8m0 = e8m0.view(_E8M0_DTYPE)

    def ptr(lens):
        out = [0]
        for n in lens:
            out.append(out[-1] + n)
        return torch.tensor(out, dtype=torch.int32, device=device)

    kv_data = {"bf16": kv.to(device), "fp8": (codes.reshape(total_kv, 1, D_QK).to(device), scale.to(device)),
               "mxfp4": (packed.to(device), e8m0.to(device))}
    config = {"batch_size": len(q_lens), "num_heads": heads, "num_kv_heads": 1, "qk_head_dim": D_QK,
              "kv_lora_rank": D_V, "qk_rope_head_dim": D_QK - D_V, "v_head_dim": D_V,
              "q_seq_len": max(q_lens), "kv_seq_len": max(kv_lens), "sm_scale": SM_SCALE}
    return q.to(device), kv_data, ptr(q_lens), ptr(kv_lens), config


def competition_cases(device: torch.device):
    """(q_lens, kv_lens, pad_scales) of the custom_kernel cases on `device`."""
    cases = [([1] * 3, [300] * 3, False), ([1, 1, 1, 1], [0, 130, 1, 64], True), ([2, 2], [40, 1], False)]
    if device.type == "cuda":
        cases += [([1] * 4, [1024] * 4, False), ([1] * 32, [8192] * 32, True)]
    return cases


def _cache_rows(kv_data, fmt):
    entry = kv_data[fmt]
    return dequantize(entry, None, fmt) if fmt == "bf16" else dequantize(entry[0], entry[1], fmt)


def check_custom_kernel(custom_kernel, device, read_format=None, strict=False, log=print) -> tuple:
    """Runs the competition-tuple cases through custom_kernel in each format (MLA_DECODE_FORMAT).

    read_format: a callable giving the kv_data key the last call read (a fallback may read
    another format than the one asked for); None: the format asked for. strict: set
    MLA_DECODE_STRICT=1 for the calls, so a fallback raises instead. Returns (passed, failed)."""
    device = torch.device(device)
    passed = failed = 0
    saved = {k: os.environ.get(k) for k in ("MLA_DECODE_FORMAT", "MLA_DECODE_STRICT")}
    try:
        if strict:
            os.environ["MLA_DECODE_STRICT"] = "1"
        for n, (q_lens, kv_lens, pad) in enumerate(competition_cases(device)):
            data = competition_input(q_lens, kv_lens, seed=100 + n, device=device, pad_scales=pad)
            q, kv_data, qo_indptr, kv_indptr, config = data
            qo = [int(v) for v in qo_indptr.tolist()]
            kp = [int(v) for v in kv_indptr.tolist()]
            items = [list(range(kp[b], kp[b + 1])) for b in range(len(kp) - 1)]
            rows_device = device if sum(kv_lens) * q.shape[1] > 2 ** 18 else torch.device("cpu")
            shape = f"B{len(q_lens)} q{max(q_lens)} kv{kv_lens if len(set(kv_lens)) > 1 else kv_lens[0]}"
            for fmt in COMPETITION_FORMATS:
                os.environ["MLA_DECODE_FORMAT"] = fmt
                label = f"{device.type:<4} custom_kernel {fmt:<6} {shape}"
                try:
                    out = custom_kernel(data)
                    read = read_format() if read_format is not None else fmt
                    if out.dtype != torch.bfloat16 or tuple(out.shape) != (q.shape[0], q.shape[1], D_V):
                        raise AssertionError(f"returned {out.dtype} {tuple(out.shape)}, expected bfloat16 "
                                             f"{(q.shape[0], q.shape[1], D_V)}")
                    if out.device != q.device:
                        raise AssertionError(f"returned a tensor on {out.device}, q is on {q.device}")
                    if out.data_ptr() == q.data_ptr():
                        raise AssertionError("returned q's storage instead of a new tensor")
                    ref, ref_lse = reference(q, _cache_rows(kv_data, read).to(rows_device), qo, items)
                    rel, _ = compare(out, ref, None, ref_lse)
                except Exception as exc:  # noqa: BLE001
                    failed += 1
                    log(f"FAIL {label}: {type(exc).__name__}: {exc}")
                    continue
                passed += 1
                note = "" if read == fmt else f"  (read the {read} cache)"
                log(f"ok   {label}  rel {rel:.1e}{note}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return passed, failed


def devices() -> list:
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def run(op=None, custom_kernel=None, read_format=None, strict=False, log=print) -> int:
    """Every case on every visible device; op and custom_kernel may each be None (skipped).
    Prints one line per case and a total; returns 0 when all passed, else 1."""
    t0 = time.time()
    passed = failed = 0
    for dev in devices():
        if op is not None:
            p, f = check_operator(op, dev, log)
            passed, failed = passed + p, failed + f
        if custom_kernel is not None:
            p, f = check_custom_kernel(custom_kernel, dev, read_format, strict, log)
            passed, failed = passed + p, failed + f
    log(f"{passed} checks passed, {failed} failed ({time.time() - t0:.1f} s)")
    return 0 if failed == 0 and passed > 0 else 1
