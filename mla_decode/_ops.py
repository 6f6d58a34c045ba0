"""Loads the native library and registers the fake (meta) kernels.

Importing mla_decode._C registers torch.ops.mla_decode.* (see
csrc/api/schema.cpp for the schemas). When the native library is missing or
was built against another torch, LOAD_ERROR holds the reason and the Python
API falls back to the reference path, loudly (see mla_decode.fallback).
"""

from __future__ import annotations

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


def native_available() -> bool:
    return LOAD_ERROR is None


if LOAD_ERROR is None:

    @torch.library.register_fake("mla_decode::decode")
    def _decode_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                     page_size, sm_scale, num_splits=0):
        torch._check(q.dim() == 3, lambda: f"mla_decode: q must be 3-D, got {q.dim()}-D")
        out = q.new_empty((q.shape[0], q.shape[1], HEAD_DIM_V), dtype=torch.bfloat16)
        lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
        return out, lse

    @torch.library.register_fake("mla_decode::decode_out")
    def _decode_out_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                         page_size, sm_scale, num_splits, out, lse):
        return None

    @torch.library.register_fake("mla_decode::_decode_out_with")
    def _decode_out_with_fake(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                              page_size, sm_scale, num_splits, out, lse, overrides):
        return None
