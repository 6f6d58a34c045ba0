"""custom_kernel(data): the tuple interface of the amd-mixed-mla competition.

data = (q, kv_data, qo_indptr, kv_indptr, config) as in
docs/interface.md; returns a new (total_q, H, 512) bfloat16 tensor.

Fallback chain, each step observable (mla_decode.fallback):
  1. the native operator on the preferred cache format (MLA_DECODE_FORMAT,
     default "fp8": the fastest native path of this build under the
     competition protocol on the H200, 47.8-48.0 us against 62.5 (bf16) and
     59.9-60.0 (MXFP4), docs/performance.md, session 7; its error, 2.5-3e-2
     against exact math on the bf16 cache, is the fp8 cache's own
     quantisation error, and MLA_DECODE_FORMAT=bf16 gives 1.7e-3 for ~30%
     more time);
  2. the native operator on the bf16 cache;
  3. the pure-PyTorch reference (mla_decode.reference).
One operator call per invocation on the fast path; no host syncs.
"""

from __future__ import annotations

import os

import torch

from . import _ops, fallback

FORMATS = ("mxfp4", "fp8", "bf16")
DEFAULT_FORMAT = "fp8"  # the fastest native path measured on the H200 (see the module docstring)


def preferred_format() -> str:
    fmt = os.environ.get("MLA_DECODE_FORMAT", DEFAULT_FORMAT).lower()
    if fmt not in FORMATS:
        raise ValueError(f"MLA_DECODE_FORMAT={fmt!r} is not one of {FORMATS}")
    return fmt


def _cache_of(kv_data, fmt):
    entry = kv_data[fmt]
    if fmt == "bf16":
        return entry, None
    kv, scale = entry
    return kv, scale


def _native(q, kv_data, qo_indptr, kv_indptr, config, fmt):
    kv, scale = _cache_of(kv_data, fmt)
    out, _ = torch.ops.mla_decode.decode(q, kv, scale, qo_indptr, kv_indptr, None, None, None, 1,
                                         float(config["sm_scale"]), 0)
    return out


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    fmt = preferred_format()
    if _ops.native_available():
        if fmt in kv_data:
            try:
                return _native(q, kv_data, qo_indptr, kv_indptr, config, fmt)
            except Exception as exc:  # noqa: BLE001 - reported, then the next path runs
                fallback.report(f"native {fmt}", "the operator raised", exc)
        else:
            fallback.report(f"native {fmt}", f"kv_data has no {fmt!r} entry")
        if fmt != "bf16":
            try:
                return _native(q, kv_data, qo_indptr, kv_indptr, config, "bf16")
            except Exception as exc:  # noqa: BLE001
                fallback.report("native bf16", "the operator raised", exc)
    else:
        fallback.report("native operators", _ops.LOAD_ERROR)
    from .reference import reference_custom_kernel
    return reference_custom_kernel(data)
