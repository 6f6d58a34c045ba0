"""Loads the native library and registers the fake (meta) kernels.

Importing mla_decode._C registers torch.ops.mla_decode.* (see
csrc/api/schema.cpp for the schemas). When the native library is missing or
was built against another torch, LOAD_ERROR holds the reason and the Python
API falls back to the reference path, loudly (see mla_decode.fallback).
"""

from __future__ import annotations

import math
import struct
import warnings

import torch

LOAD_ERROR: str | None = None
try:
    from . import _build_info as BUILD_INFO
except ImportError:  # a source tree that was never built
    BUILD_INFO = None


def _torch_mismatch(built: str, running: str) -> bool:
    # A C++ extension is tied to the exact torch it was compiled against:
    # loading it into another one fails with undefined symbols, or worse.
    return built.split("+")[0] != running.split("+")[0]


if BUILD_INFO is None:
    LOAD_ERROR = ("mla_decode's native library has not been built in this tree; build it with "
                  "pip install --no-build-isolation -e .")
elif _torch_mismatch(BUILD_INFO.TORCH_VERSION, torch.__version__):
    LOAD_ERROR = (
        f"mla_decode {BUILD_INFO.VERSION} was built against torch {BUILD_INFO.TORCH_VERSION}, but torch "
        f"{torch.__version__} is installed; its native library is not loaded. Rebuild it against this torch "
        "(pip install --no-build-isolation -e .) or install the wheel built for it."
    )
else:
    try:
        from . import _C  # noqa: F401  (registers the operators)
    except ImportError as exc:  # pragma: no cover - exercised only on broken installs
        LOAD_ERROR = (
            f"the native library mla_decode._C could not be loaded ({exc}). Rebuild it against the installed "
            f"torch {torch.__version__}: pip install --no-build-isolation -e ."
        )

HEAD_DIM_V = 512
HEAD_DIM_QK = 576
MXFP4_ROW_BYTES = 288
MX_BLOCKS_PER_ROW = 18
MAX_HEADS = 128
MAX_NUM_SPLITS = 256
INT32_MAX = 2**31 - 1


def native_available() -> bool:
    return LOAD_ERROR is None


# ---- the fake (meta) kernels' checks --------------------------------------------------------
# The operators' own checks (csrc/api/validation.cpp, check_inputs / check_outputs), repeated
# with the same messages for what needs no memory: a fake kernel runs for torch.compile's
# tracing and for every call that involves a meta tensor, and must refuse what the real kernel
# refuses (a CPU call with one meta tensor would otherwise return uninitialised tensors).
# Not repeated: the GPU's alignment of pointers and rows (out's rows 8-byte aligned), the overlap of
# two tensors' memory (a fake tensor has none), and the index values (the data). tests/test_hostile.py runs every shape
# case on the CPU and on meta tensors and compares the messages.

def _c10_dtype_names() -> dict:
    """torch.float32 -> "Float", as c10::toString(ScalarType) spells it in the operators' messages."""
    names = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # creating a tensor of some dtypes warns (complex32)
        for value in vars(torch).values():
            if isinstance(value, torch.dtype) and value not in names and \
                    "q" not in str(value).replace("torch.", "")[:2]:
                try:
                    names[value] = torch.empty(0, dtype=value).type()[len("torch."):-len("Tensor")]
                except Exception:  # noqa: BLE001 - a dtype without a tensor type keeps its Python name
                    names[value] = str(value)
    return names


_DTYPE_NAMES = _c10_dtype_names()
_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_MX_CODES = tuple(d for d in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)
_MX_SCALES = tuple(d for d in (torch.uint8, getattr(torch, "float8_e8m0fnu", None)) if d is not None)
_FORMAT_NAMES = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn",
                 torch.float8_e4m3fnuz: "float8_e4m3fnuz"}


def _dt(t) -> str:
    return _DTYPE_NAMES.get(t.dtype, str(t.dtype))


def _shape(t) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _req(cond, message) -> None:
    """torch._check with the operator's message (RuntimeError, as TORCH_CHECK raises)."""
    torch._check(cond, lambda: message() if callable(message) else message)


def _int32_vector(t, name) -> None:
    _req(t.dtype == torch.int32, lambda: f"mla_decode: {name} must be int32, but it is {_dt(t)}.")
    _req(t.dim() == 1, lambda: f"mla_decode: {name} must be 1-D, but it has shape {_shape(t)}.")
    _req(t.stride(0) == 1 or t.shape[0] <= 1,
         lambda: f"mla_decode: {name} must be contiguous, but its stride is {t.stride(0)}.")


def _float32_finite_nonzero(x) -> bool:
    """Whether float(x), rounded to float32 as the kernels take it, is finite and nonzero."""
    try:
        f32 = struct.unpack("f", struct.pack("f", float(x)))[0]
    except OverflowError:  # beyond float32's range: infinite there
        return False
    return math.isfinite(f32) and f32 != 0.0


def _overlaps_itself(t) -> bool:
    """validation.cpp's overlaps_itself (with concrete sizes and strides; False when symbolic)."""
    sizes, strides = list(t.shape), list(t.stride())
    if not all(isinstance(v, int) for v in sizes + strides) or t.numel() == 0:
        return False
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, sizes) if sz > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def check_inputs(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size,
                 sm_scale, num_splits) -> None:
    """csrc/api/validation.cpp check_inputs (devices, q, index tensors, layout, cache, scale, scalars)."""
    for name, t in (("q", q), ("kv_cache", kv_cache), ("qo_indptr", qo_indptr)):
        _req(t is not None, f"mla_decode: {name} must be a tensor, but it is undefined (None).")
    for name, t in (("kv_cache", kv_cache), ("kv_scale", kv_scale), ("qo_indptr", qo_indptr),
                    ("kv_indptr", kv_indptr), ("kv_indices", kv_indices), ("block_table", block_table),
                    ("kv_lens", kv_lens)):
        if t is not None:
            _req(t.device == q.device, lambda name=name, t=t: f"mla_decode: {name} must be on the same device as q "
                 f"({q.device}), but it is on {t.device}.")
    # q
    _req(q.dtype == torch.bfloat16, lambda: f"mla_decode: q must be bfloat16, but it is {_dt(q)}.")
    _req(q.dim() == 3, lambda: f"mla_decode: q must be 3-D (total_q, num_heads, 576), but it has shape {_shape(q)}.")
    _req(q.shape[2] == HEAD_DIM_QK, lambda: f"mla_decode: q's last dim must be {HEAD_DIM_QK} (kv_lora_rank 512 + "
         f"rope 64), but it is {q.shape[2]}.")
    _req(q.shape[1] >= 1 and q.shape[1] <= MAX_HEADS,
         lambda: f"mla_decode: q must have 1 to {MAX_HEADS} heads, but it has {q.shape[1]}.")
    _req(q.stride(2) == 1, lambda: f"mla_decode: q's last dim must be contiguous (stride 1), but its stride is "
         f"{q.stride(2)}.")
    _req(q.shape[0] * q.shape[1] <= INT32_MAX, lambda: f"mla_decode: q has {q.shape[0]} x {q.shape[1]} query rows, "
         f"more than the int32 limit of {INT32_MAX}.")
    # qo_indptr
    qo = qo_indptr
    _int32_vector(qo, "qo_indptr")
    _req(qo.shape[0] >= 2, lambda: f"mla_decode: qo_indptr must have batch_size + 1 >= 2 entries, but it has "
         f"{qo.shape[0]}.")
    _req(qo.shape[0] - 1 <= INT32_MAX, lambda: f"mla_decode: qo_indptr has {qo.shape[0]} entries, a batch of "
         f"{qo.shape[0] - 1} items, more than the int32 limit of {INT32_MAX}.")
    batch = qo.shape[0] - 1
    # layout
    paged = block_table is not None
    if paged:
        _req(kv_lens is not None, "mla_decode: block_table was given without kv_lens; the paged layout needs both "
             "(kv_lens[b] = tokens of item b).")
        _req(kv_indptr is None and kv_indices is None, "mla_decode: give either kv_indptr (with optional "
             "kv_indices) or block_table with kv_lens, not both.")
        _req(page_size >= 1 and page_size <= 1 << 16,
             lambda: f"mla_decode: page_size must be in [1, 65536], but it is {page_size}.")
        bt = block_table
        _req(bt.dtype == torch.int32, lambda: f"mla_decode: block_table must be int32, but it is {_dt(bt)}.")
        _req(bt.dim() == 2, lambda: f"mla_decode: block_table must be 2-D (batch_size, max_pages), but it has shape "
             f"{_shape(bt)}.")
        _req(bt.shape[0] == batch, lambda: f"mla_decode: block_table must have one row per item, batch_size = "
             f"{batch} (qo_indptr has {qo.shape[0]} entries), but it has shape {_shape(bt)}.")
        _req(bt.stride(1) == 1 or bt.shape[1] <= 1, lambda: f"mla_decode: block_table rows must be contiguous, but "
             f"its column stride is {bt.stride(1)}.")
        _req(bt.shape[1] * page_size <= INT32_MAX, lambda: f"mla_decode: block_table's {bt.shape[1]} pages of "
             f"{page_size} tokens cover {bt.shape[1] * page_size} tokens per item, more than the int32 limit of "
             f"{INT32_MAX}.")
        _int32_vector(kv_lens, "kv_lens")
        _req(kv_lens.shape[0] == batch, lambda: f"mla_decode: kv_lens must have batch_size entries and qo_indptr "
             f"batch_size + 1, but qo_indptr has {qo.shape[0]} entries (batch_size {batch}) and kv_lens has "
             f"{kv_lens.shape[0]}.")
    else:
        _req(kv_indptr is not None, "mla_decode: neither kv_indptr nor block_table was given; pass kv_indptr "
             "(batch_size + 1 int32) or block_table with kv_lens.")
        _req(kv_lens is None, "mla_decode: kv_lens is only used with block_table; with kv_indptr the lengths are "
             "kv_indptr[b+1] - kv_indptr[b].")
        _req(page_size == 1, lambda: f"mla_decode: page_size must be 1 with kv_indptr (rows are tokens), but it is "
             f"{page_size}; use block_table for paged caches.")
        _int32_vector(kv_indptr, "kv_indptr")
        _req(kv_indptr.shape[0] == qo.shape[0], lambda: f"mla_decode: qo_indptr and kv_indptr must have the same "
             f"length, batch_size + 1, but qo_indptr has {qo.shape[0]} entries (batch_size {qo.shape[0] - 1}) and "
             f"kv_indptr has {kv_indptr.shape[0]} (batch_size {kv_indptr.shape[0] - 1}).")
        if kv_indices is not None:
            _int32_vector(kv_indices, "kv_indices")
    # cache
    kv = kv_cache
    if kv.dtype in _FORMAT_NAMES:
        fmt, row_elems = _FORMAT_NAMES[kv.dtype], HEAD_DIM_QK
    elif kv.dtype in _MX_CODES:
        fmt, row_elems = "mxfp4", MXFP4_ROW_BYTES
    else:
        _req(False, f"mla_decode: kv_cache must be bfloat16, float8_e4m3fn, float8_e4m3fnuz, or uint8 / "
             f"float4_e2m1fn_x2 (MXFP4), but it is {_dt(kv)}.")
    _req(kv.dim() >= 2 and kv.dim() <= 4, lambda: f"mla_decode: kv_cache must be 2-D (rows, D), 3-D (rows, 1, D) "
         f"or (pages, page_size, D), or 4-D (pages, page_size, 1, D), but it has shape {_shape(kv)}.")
    _req(kv.shape[-1] == row_elems, lambda: f"mla_decode: a {fmt} kv_cache must have {row_elems} elements per row "
         f"(last dim), but it has {kv.shape[-1]}.")
    _req(kv.stride(-1) == 1, lambda: f"mla_decode: kv_cache's last dim must be contiguous (stride 1), but its "
         f"stride is {kv.stride(-1)}.")
    if kv.dim() == 4:
        _req(kv.shape[2] == 1, lambda: f"mla_decode: a 4-D kv_cache must be (pages, page_size, 1, D) with one KV "
             f"head, but dim 2 is {kv.shape[2]}.")
    if kv.dim() == 2 or (kv.shape[1] == 1 and not (paged and page_size != 1)):
        row_stride, num_rows = kv.stride(0), kv.shape[0]
    else:
        _req(paged, lambda: f"mla_decode: kv_cache of shape {_shape(kv)} is paged (pages, page_size, ...) but no "
             "block_table was given; pass (rows, D) or (rows, 1, D) with kv_indptr.")
        _req(kv.shape[1] == page_size, lambda: f"mla_decode: kv_cache's dim 1 is the page size ({page_size}), but "
             f"it is {kv.shape[1]}.")
        row_stride = kv.stride(1)
        _req(kv.shape[0] <= 1 or kv.stride(0) == page_size * row_stride,
             lambda: f"mla_decode: kv_cache pages must be evenly strided token rows (page stride = page_size x row "
             f"stride = {page_size * row_stride}), but the page stride is {kv.stride(0)}.")
        num_rows = kv.shape[0] * kv.shape[1]
    if num_rows <= 1:
        row_stride = row_elems
    _req(row_stride >= row_elems, lambda: f"mla_decode: kv_cache rows overlap (row stride {row_stride} < "
         f"{row_elems} elements per row).")
    _req(num_rows <= INT32_MAX, lambda: f"mla_decode: kv_cache has {num_rows} token rows, more than the int32 index "
         f"limit of {INT32_MAX}.")
    # kv_scale
    s = kv_scale
    if fmt == "bfloat16":
        _req(s is None, "mla_decode: kv_scale must be None for a bfloat16 kv_cache.")
    elif fmt == "mxfp4":
        _req(s is not None, lambda: f"mla_decode: an MXFP4 kv_cache needs kv_scale, the E8M0 block scales (rows >= "
             f"{num_rows}, columns >= {MX_BLOCKS_PER_ROW}).")
        _req(s.dtype in _MX_SCALES, lambda: f"mla_decode: MXFP4 kv_scale must be uint8 or float8_e8m0fnu, but it is "
             f"{_dt(s)}.")
        _req(s.dim() == 2, lambda: f"mla_decode: MXFP4 kv_scale must be 2-D (rows, blocks), but it has shape "
             f"{_shape(s)}.")
        _req(s.shape[0] >= num_rows and s.shape[1] >= MX_BLOCKS_PER_ROW, lambda: f"mla_decode: MXFP4 kv_scale must "
             f"have at least {num_rows} rows and {MX_BLOCKS_PER_ROW} columns, but it has shape {_shape(s)}.")
    else:
        _req(s is not None, "mla_decode: an fp8 kv_cache needs kv_scale, a float32 tensor of shape (1,) holding the "
             "per-tensor dequantisation scale.")
        _req(s.dtype == torch.float32, lambda: f"mla_decode: fp8 kv_scale must be float32, but it is {_dt(s)}.")
        _req(s.numel() == 1, lambda: f"mla_decode: fp8 kv_scale must hold one value (per-tensor scale), but it has "
             f"shape {_shape(s)}.")
    # scalars
    _req(_float32_finite_nonzero(sm_scale),
         lambda: f"mla_decode: sm_scale must be finite and nonzero in float32, but it is {sm_scale:.9g}.")
    _req(num_splits >= 0 and num_splits <= MAX_NUM_SPLITS, lambda: f"mla_decode: num_splits must be in [0, "
         f"{MAX_NUM_SPLITS}] (0 = automatic), but it is {num_splits}.")


def check_outputs(q, out, lse) -> None:
    """csrc/api/validation.cpp check_outputs, but for the overlap of two tensors' memory."""
    for name, t in (("out", out), ("lse", lse)):
        _req(t.device == q.device, lambda name=name, t=t: f"mla_decode: {name} must be on the same device as q "
             f"({q.device}), but it is on {t.device}.")
    _req(out.dtype == torch.bfloat16, lambda: f"mla_decode: out must be bfloat16, but it is {_dt(out)}.")
    _req(out.dim() == 3 and out.shape[0] == q.shape[0] and out.shape[1] == q.shape[1] and out.shape[2] == HEAD_DIM_V,
         lambda: f"mla_decode: out must have shape ({q.shape[0]}, {q.shape[1]}, {HEAD_DIM_V}), but it has shape "
         f"{_shape(out)}.")
    _req(out.stride(2) == 1, lambda: f"mla_decode: out's last dim must be contiguous, but its stride is "
         f"{out.stride(2)}.")
    _req(lse.dtype == torch.float32, lambda: f"mla_decode: lse must be float32, but it is {_dt(lse)}.")
    _req(lse.dim() == 2 and lse.shape[0] == q.shape[0] and lse.shape[1] == q.shape[1],
         lambda: f"mla_decode: lse must have shape ({q.shape[0]}, {q.shape[1]}), but it has shape {_shape(lse)}.")
    for name, t in (("out", out), ("lse", lse)):
        _req(not _overlaps_itself(t), lambda name=name, t=t: f"mla_decode: {name}'s elements must not overlap in "
             f"memory, but its strides {list(t.stride())} (shape {_shape(t)}) map several of them to one address; "
             "pass a tensor of distinct elements (such as torch.empty's).")


if LOAD_ERROR is None:

    @torch.library.register_fake("mla_decode::decode")
    def _decode_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                     page_size, sm_scale, num_splits=0):
        check_inputs(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size,
                     sm_scale, num_splits)
        out = q.new_empty((q.shape[0], q.shape[1], HEAD_DIM_V), dtype=torch.bfloat16)
        lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
        return out, lse

    @torch.library.register_fake("mla_decode::decode_out")
    def _decode_out_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                         page_size, sm_scale, num_splits, out, lse):
        check_inputs(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size,
                     sm_scale, num_splits)
        check_outputs(q, out, lse)

    @torch.library.register_fake("mla_decode::_decode_out_with")
    def _decode_out_with_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                              page_size, sm_scale, num_splits, out, lse, overrides):
        check_inputs(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size,
                     sm_scale, num_splits)
        check_outputs(q, out, lse)

    @torch.library.register_fake("mla_decode::_check_index_values")
    def _check_index_values_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                                 page_size):
        check_inputs(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size,
                     1.0, 0)

    # The check returns nothing and writes nothing: keep graph passes from removing it as dead code.
    if hasattr(torch.fx.node, "has_side_effect"):
        torch.fx.node.has_side_effect(torch.ops.mla_decode._check_index_values.default)
