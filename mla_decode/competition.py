"""custom_kernel(data): the tuple interface of the amd-mixed-mla competition.

data = (q, kv_data, qo_indptr, kv_indptr, config), the amd-mixed-mla problem's
interface (kv_data holds the cache as "bf16", "fp8" and / or "mxfp4"); returns
a new (total_q, H, 512) bfloat16 tensor.

Paths, in order, over the formats kv_data actually holds:
  1. the native operator on the preferred cache format (MLA_DECODE_FORMAT,
     default "fp8": the fastest native path of this build under the
     competition protocol; docs/performance.md has the measurements and the
     error of each format against exact math);
  2. the native operator on each other format kv_data holds, bf16 first;
  3. the pure-PyTorch float64 reference (mla_decode.reference) on the first
     format kv_data holds.
Only platform reasons move a call down the chain, each reported once per
distinct reason (mla_decode.fallback; MLA_DECODE_STRICT=1 raises instead):
the native library is not loaded, kv_data lacks the preferred format, or the
operator has no kernel for the tensors' device or the format
(NotImplementedError). Bad data never does: it raises ValueError (the
structure of `data`) or RuntimeError (the operator's or the reference's
check, naming which part of `data` it is about).
One operator call per invocation on the fast path; no host syncs.
"""

from __future__ import annotations

import os

import torch

from . import _ops, fallback

FORMATS = ("mxfp4", "fp8", "bf16")
DEFAULT_FORMAT = "fp8"  # the fastest native path measured on the H200 (docs/performance.md)

# The operator's argument names, as the parts of `data` they come from (for messages).
_ARGUMENTS = {"bf16": "q = data[0], kv_cache = kv_data['bf16'], qo_indptr = data[2], kv_indptr = data[3]",
              "fp8": "q = data[0], kv_cache = kv_data['fp8'][0], kv_scale = kv_data['fp8'][1], qo_indptr = data[2], "
                     "kv_indptr = data[3]",
              "mxfp4": "q = data[0], kv_cache = kv_data['mxfp4'][0], kv_scale = kv_data['mxfp4'][1], "
                       "qo_indptr = data[2], kv_indptr = data[3]"}


# The operator, looked up once (None without the native library).
_DECODE = torch.ops.mla_decode.decode if _ops.native_available() else None


def preferred_format() -> str:
    fmt = os.environ.get("MLA_DECODE_FORMAT", DEFAULT_FORMAT).lower()
    if fmt not in FORMATS:
        raise ValueError(f"MLA_DECODE_FORMAT={fmt!r} is not one of {FORMATS}")
    return fmt


def _unpack(data):
    """(q, kv_data, qo_indptr, kv_indptr, sm_scale), or ValueError naming what is malformed."""
    if not isinstance(data, (tuple, list)) or len(data) != 5:
        got = f"a {type(data).__name__} of {len(data)} items" if isinstance(data, (tuple, list)) else \
            f"a {type(data).__name__}"
        raise ValueError(f"custom_kernel: data must be (q, kv_data, qo_indptr, kv_indptr, config), but it is {got}")
    q, kv_data, qo_indptr, kv_indptr, config = data
    if not isinstance(kv_data, dict):
        raise ValueError(f"custom_kernel: kv_data (data[1]) must be a dict of cache formats, but it is a "
                         f"{type(kv_data).__name__}")
    if not isinstance(config, dict):
        raise ValueError(f"custom_kernel: config (data[4]) must be a dict, but it is a {type(config).__name__}")
    if "sm_scale" not in config:
        raise ValueError(f"custom_kernel: config has no 'sm_scale' (the softmax scale, 1/sqrt(576) for DeepSeek); "
                         f"its keys are {sorted(map(str, config))}")
    try:
        sm_scale = float(config["sm_scale"])
    except (TypeError, ValueError):
        raise ValueError(f"custom_kernel: config['sm_scale'] must be a number, but it is "
                         f"{config['sm_scale']!r}") from None
    return q, kv_data, qo_indptr, kv_indptr, sm_scale


def _cache_of(kv_data, fmt):
    """kv_data[fmt] as (cache, scale), or ValueError naming what is malformed."""
    entry = kv_data[fmt]
    if fmt == "bf16":
        return entry, None
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        got = f"a {type(entry).__name__} of {len(entry)} items" if isinstance(entry, (tuple, list)) else \
            f"a {type(entry).__name__}"
        raise ValueError(f"custom_kernel: kv_data[{fmt!r}] must be a (cache, scale) pair, but it is {got}")
    return entry[0], entry[1]


def _native(q, kv_data, fmt, qo_indptr, kv_indptr, sm_scale):
    """The operator on kv_data[fmt]. NotImplementedError (no kernel for this device or format) passes
    through for the caller to fall back on; any other refusal is bad data, re-raised with the parts of
    `data` the operator's argument names stand for."""
    kv, scale = _cache_of(kv_data, fmt)
    try:
        out, _ = _DECODE(q, kv, scale, qo_indptr, kv_indptr, None, None, None, 1, sm_scale, 0)
    except (NotImplementedError, torch.OutOfMemoryError):
        raise
    except RuntimeError as exc:
        raise RuntimeError(f"custom_kernel: the native {fmt} call refused data ({_ARGUMENTS[fmt]}): {exc}") from exc
    return out


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, sm_scale = _unpack(data)
    fmt = preferred_format()
    if _ops.native_available() and fmt in kv_data:
        try:
            return _native(q, kv_data, fmt, qo_indptr, kv_indptr, sm_scale)
        except NotImplementedError as exc:
            fallback.report(f"native {fmt}", "the operator has no kernel for this device or format", exc)
    return _fallback_chain(data, q, kv_data, qo_indptr, kv_indptr, sm_scale, fmt)


def _fallback_chain(data, q, kv_data, qo_indptr, kv_indptr, sm_scale, fmt):
    held = [f for f in dict.fromkeys((fmt, "bf16") + FORMATS) if f in kv_data]
    if not held:
        raise ValueError(f"custom_kernel: kv_data must hold at least one of {list(FORMATS)}, but its keys are "
                         f"{sorted(map(str, kv_data))}")
    if not _ops.native_available():
        fallback.report("native operators", _ops.LOAD_ERROR)
    else:
        if fmt not in kv_data:
            fallback.report(f"native {fmt}", f"kv_data has no {fmt!r} entry")
        for other in held:
            if other == fmt:
                continue  # tried by custom_kernel
            try:
                return _native(q, kv_data, other, qo_indptr, kv_indptr, sm_scale)
            except NotImplementedError as exc:
                fallback.report(f"native {other}", "the operator has no kernel for this device or format", exc)
    from .reference import reference_custom_kernel
    return reference_custom_kernel(data, kv_format=held[0])
