"""FlashMLA-compatible entry points (dense decode).

A FlashMLA user switches with one import line:

    # from flash_mla import get_mla_metadata, flash_mla_with_kvcache
    from mla_decode.flash_mla import get_mla_metadata, flash_mla_with_kvcache

Both of FlashMLA's interfaces work, with the return types of each:

* current: `meta, _ = get_mla_metadata()` (no arguments) returns a
  scheduler-metadata object and None; the first flash_mla_with_kvcache call
  with that object records the call's configuration in it (num_splits must be
  None); later calls with the same object must have the same batch size,
  query length, heads, page size, causal flag and cache type (a ValueError
  names the one that differs), as FlashMLA requires;
* older: `tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens,
  seq_len_q * num_heads_q // num_heads_k, num_heads_k)` returns two int32
  tensors, passed on to flash_mla_with_kvcache.

The conventions are FlashMLA's (its tests' reference): softmax_scale defaults
to head_dim ** -0.5; with causal and seq_len_q > 1, query i of a sequence of L
keys sees the first L - seq_len_q + i + 1 of them (bottom-right), without it
every query sees all L; out is (batch, seq_len_q, heads, 512) bf16 and
softmax_lse (batch, heads, seq_len_q) float32, the natural-log LSE; a query that
sees no key (cache_seqlens 0, or masked by causal) gets out = 0 and
softmax_lse = +inf. (mla_decode.decode itself returns -inf there; this module
converts.)

Differences from FlashMLA, stated rather than hidden:

* the metadata carries no schedule: this library plans its KV split from
  shapes on every call (no device reads, no host sync), so the older
  interface's tensors are placeholders and the current interface's object only
  records the configuration;
* the cache must be bfloat16 with one KV head (num_heads_k = 1, MLA):
  FlashMLA's fp8 cache layout (is_fp8_kvcache=True, 656 bytes per token) and
  its sparse attention (indices, attn_sink, extra_k_cache, topk_length, ...)
  are refused with an error; use mla_decode.decode for fp8 and MXFP4 caches;
* reusing one metadata object with other cache_seqlens values is accepted
  (the split is planned per call), where FlashMLA requires the same values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple, Union

import torch

from . import _ops

_HEAD_DIM = 576
_HEAD_DIM_V = 512


@dataclasses.dataclass
class MLASchedMeta:
    """What get_mla_metadata() (no arguments) returns; the first flash_mla_with_kvcache call that
    receives it fills `config`. Attribute names follow FlashMLA's scheduler-metadata object;
    tile_scheduler_metadata and num_splits stay None (no schedule is precomputed here)."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool

    have_initialized: bool = False
    config: Optional["MLASchedMeta.Config"] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(cache_seqlens: Optional[torch.Tensor] = None, num_heads_per_head_k: Optional[int] = None,
                     num_heads_k: Optional[int] = None):
    """FlashMLA's scheduler-metadata call, in both of its interfaces.

    No arguments (FlashMLA's current interface): returns (MLASchedMeta(), None); pass the object
    as tile_scheduler_metadata and None as num_splits.

    Three arguments (the older interface):
        cache_seqlens: (batch_size,) int32.
        num_heads_per_head_k: seq_len_q * num_heads_q // num_heads_k.
        num_heads_k: number of KV heads (1 for MLA).
    returns (tile_scheduler_metadata (1, 8) int32, num_splits (batch_size + 1,) int32), both
    placeholders that flash_mla_with_kvcache accepts and ignores.
    """
    given = [a is not None for a in (cache_seqlens, num_heads_per_head_k, num_heads_k)]
    if not any(given):
        return MLASchedMeta(), None
    if not all(given):
        raise TypeError("get_mla_metadata: call it with no arguments (the current interface) or with all three of "
                        "cache_seqlens, num_heads_per_head_k, num_heads_k (the older one); got "
                        f"cache_seqlens={'set' if given[0] else None}, num_heads_per_head_k={num_heads_per_head_k}, "
                        f"num_heads_k={num_heads_k}")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        got = (f"{cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)}" if isinstance(cache_seqlens, torch.Tensor)
               else type(cache_seqlens).__name__)
        raise ValueError(f"get_mla_metadata: cache_seqlens must be a 1-D int32 tensor, got {got}")
    if num_heads_k != 1:
        raise ValueError(f"get_mla_metadata: MLA has one latent KV head (num_heads_k=1), got {num_heads_k}")
    if num_heads_per_head_k < 1:
        raise ValueError(f"get_mla_metadata: num_heads_per_head_k must be >= 1, got {num_heads_per_head_k}")
    dev = cache_seqlens.device
    return (torch.zeros((1, 8), dtype=torch.int32, device=dev),
            torch.zeros((cache_seqlens.shape[0] + 1,), dtype=torch.int32, device=dev))


_UNSUPPORTED = ("indices", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length",
                "extra_topk_length")


def _check_metadata(meta, num_splits, config: MLASchedMeta.Config) -> None:
    if isinstance(meta, MLASchedMeta):
        if num_splits is not None:
            raise ValueError("flash_mla_with_kvcache: with the metadata object of get_mla_metadata() (no arguments), "
                             f"num_splits must be None, got {type(num_splits).__name__}")
        if not meta.have_initialized:
            meta.config = config
            meta.have_initialized = True
            return
        for field in dataclasses.fields(config):
            want, got = getattr(meta.config, field.name), getattr(config, field.name)
            if want != got:
                raise ValueError(f"flash_mla_with_kvcache: this metadata object was filled by a call with "
                                 f"{field.name}={want}, this call has {field.name}={got}; use one metadata object "
                                 "per configuration (get_mla_metadata() again)")
    elif not isinstance(meta, torch.Tensor):
        raise TypeError("flash_mla_with_kvcache: tile_scheduler_metadata must be what get_mla_metadata returned (its "
                        f"metadata object, or the older interface's tensor), got {type(meta).__name__}")


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           tile_scheduler_metadata: Union[MLASchedMeta, torch.Tensor],
                           num_splits: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None,
                           causal: bool = False, is_fp8_kvcache: bool = False,
                           indices: Optional[torch.Tensor] = None, attn_sink: Optional[torch.Tensor] = None,
                           extra_k_cache: Optional[torch.Tensor] = None,
                           extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                           topk_length: Optional[torch.Tensor] = None,
                           extra_topk_length: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's paged dense decode call.

    Arguments:
        q: (batch_size, seq_len_q, num_heads_q, 576) bfloat16.
        k_cache: (num_blocks, page_block_size, 1, 576) bfloat16 (V = the first 512 dims).
        block_table: (batch_size, max_num_blocks_per_seq) int32.
        cache_seqlens: (batch_size,) int32.
        head_dim_v: 512.
        tile_scheduler_metadata, num_splits: from get_mla_metadata, either interface (see the
            module doc); with the current interface's object num_splits must be None.
        softmax_scale: default 576 ** -0.5.
        causal: with seq_len_q > 1, query i sees the first L - seq_len_q + i + 1 keys
            (bottom-right); without it every query sees all L keys.
        is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
            extra_topk_length: FlashMLA's fp8 and sparse modes; only their defaults (False / None)
            are accepted.
    Returns:
        out: (batch_size, seq_len_q, num_heads_q, 512) bfloat16.
        softmax_lse: (batch_size, num_heads_q, seq_len_q) float32, natural log; +inf for a query
            that sees no key (whose out is 0).
    """
    if not _ops.native_available():
        raise RuntimeError(_ops.LOAD_ERROR)
    extras = {"indices": indices, "attn_sink": attn_sink, "extra_k_cache": extra_k_cache,
              "extra_indices_in_kvcache": extra_indices_in_kvcache, "topk_length": topk_length,
              "extra_topk_length": extra_topk_length}
    given = [name for name in _UNSUPPORTED if extras[name] is not None]
    if given:
        raise ValueError(f"flash_mla_with_kvcache: FlashMLA's sparse attention is not supported here; "
                         f"{', '.join(given)} must be None")
    if is_fp8_kvcache:
        raise ValueError("flash_mla_with_kvcache: is_fp8_kvcache=True (FlashMLA's 656-byte fp8 cache layout) is not "
                         "supported; mla_decode.decode takes fp8 (per-tensor scale) and MXFP4 caches")
    if block_table is None or cache_seqlens is None:
        raise ValueError("flash_mla_with_kvcache: dense decode needs block_table and cache_seqlens, got "
                         f"block_table={'set' if block_table is not None else None}, "
                         f"cache_seqlens={'set' if cache_seqlens is not None else None}")
    if q.dim() != 4 or q.shape[-1] != _HEAD_DIM:
        raise ValueError(f"flash_mla_with_kvcache: q must be (batch, seq_len_q, num_heads, {_HEAD_DIM}), "
                         f"got {tuple(q.shape)}")
    if head_dim_v != _HEAD_DIM_V:
        raise ValueError(f"flash_mla_with_kvcache: head_dim_v must be {_HEAD_DIM_V}, got {head_dim_v}")
    if k_cache.dim() != 4 or k_cache.shape[3] != _HEAD_DIM:
        raise ValueError(f"flash_mla_with_kvcache: k_cache must be (num_blocks, page_block_size, 1, {_HEAD_DIM}), "
                         f"got {tuple(k_cache.shape)}")
    if k_cache.shape[2] != 1:
        raise ValueError(f"flash_mla_with_kvcache: MLA has one latent KV head (k_cache.shape[2] = 1), got "
                         f"{k_cache.shape[2]}")
    if k_cache.dtype != torch.bfloat16:
        raise ValueError(f"flash_mla_with_kvcache: k_cache must be bfloat16 here, got {k_cache.dtype} (FlashMLA's "
                         "fp8 cache layout is not supported; mla_decode.decode takes fp8 and MXFP4 caches)")
    batch, s_q, heads, _ = q.shape
    if block_table.dim() != 2 or block_table.shape[0] != batch or tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"flash_mla_with_kvcache: block_table must be (batch_size={batch}, max_blocks) and "
                         f"cache_seqlens ({batch},), got {tuple(block_table.shape)} and "
                         f"{tuple(cache_seqlens.shape)}")
    _check_metadata(tile_scheduler_metadata, num_splits,
                    MLASchedMeta.Config(b=batch, s_q=s_q, h_q=heads, page_block_size=k_cache.shape[1], h_k=1,
                                        causal=bool(causal), is_fp8_kvcache=False))
    scale = softmax_scale if softmax_scale is not None else _HEAD_DIM ** -0.5
    page = k_cache.shape[1]
    q_flat = q.reshape(batch * s_q, heads, _HEAD_DIM)
    if causal or s_q == 1:
        qo_indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=q.device) * s_q
        table, lens = block_table, cache_seqlens
    else:
        # Non-causal multi-token queries: every query token is its own item over the same
        # pages, so it sees all keys of its sequence.
        qo_indptr = torch.arange(0, batch * s_q + 1, dtype=torch.int32, device=q.device)
        table = block_table.repeat_interleave(s_q, dim=0)
        lens = cache_seqlens.repeat_interleave(s_q)
    out, lse = torch.ops.mla_decode.decode(q_flat, k_cache, None, qo_indptr, None, None, table, lens, page,
                                           float(scale), 0)
    # FlashMLA's LSE of a query that sees no key is +inf (mla_decode's is -inf).
    lse = lse.view(batch, s_q, heads).transpose(1, 2).contiguous()
    lse.masked_fill_(lse == -math.inf, math.inf)
    return out.view(batch, s_q, heads, _HEAD_DIM_V), lse
