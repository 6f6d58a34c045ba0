"""FlashMLA-compatible entry points.

A FlashMLA user switches with one import line:

    # from flash_mla import get_mla_metadata, flash_mla_with_kvcache
    from mla_decode.flash_mla import get_mla_metadata, flash_mla_with_kvcache

Same argument order, shapes and return values as FlashMLA's dense decode API
(paged bf16 cache, block size 64 in practice, `cache_seqlens`, out plus LSE in
FlashMLA's layout). Differences, stated rather than hidden:

* the metadata returned by get_mla_metadata is a placeholder: this library
  plans its KV split from shapes on every call (no device reads, no host
  sync), so flash_mla_with_kvcache accepts and ignores it;
* the cache must be bfloat16 (FlashMLA's own fp8 cache layout, 656 bytes per
  token, is not supported: use mla_decode.decode with an fp8 or MXFP4 cache);
* softmax_lse is the natural-log LSE, -inf for a query that sees no key.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

from . import _ops

_HEAD_DIM = 576
_HEAD_DIM_V = 512


def get_mla_metadata(cache_seqlens: torch.Tensor, num_heads_per_head_k: int,
                     num_heads_k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's scheduler-metadata call.

    Arguments:
        cache_seqlens: (batch_size,) int32.
        num_heads_per_head_k: seq_len_q * num_heads_q // num_heads_k.
        num_heads_k: number of KV heads (1 for MLA).
    Returns:
        tile_scheduler_metadata: (1, 8) int32 placeholder.
        num_splits: (batch_size + 1,) int32 placeholder.
    Both are accepted and ignored by flash_mla_with_kvcache (see the module doc).
    """
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise ValueError(f"get_mla_metadata: cache_seqlens must be a 1-D int32 tensor, got {cache_seqlens.dtype} "
                         f"of shape {tuple(cache_seqlens.shape)}")
    if num_heads_k != 1:
        raise ValueError(f"get_mla_metadata: MLA has one latent KV head (num_heads_k=1), got {num_heads_k}")
    if num_heads_per_head_k < 1:
        raise ValueError(f"get_mla_metadata: num_heads_per_head_k must be >= 1, got {num_heads_per_head_k}")
    dev = cache_seqlens.device
    return (torch.zeros((1, 8), dtype=torch.int32, device=dev),
            torch.zeros((cache_seqlens.shape[0] + 1,), dtype=torch.int32, device=dev))


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int, tile_scheduler_metadata: torch.Tensor,
                           num_splits: torch.Tensor, softmax_scale: float | None = None,
                           causal: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's paged decode call.

    Arguments:
        q: (batch_size, seq_len_q, num_heads_q, 576) bfloat16.
        k_cache: (num_blocks, page_block_size, 1, 576) bfloat16 (V = the first 512 dims).
        block_table: (batch_size, max_num_blocks_per_seq) int32.
        cache_seqlens: (batch_size,) int32.
        head_dim_v: 512.
        tile_scheduler_metadata, num_splits: from get_mla_metadata (ignored).
        softmax_scale: default 1 / sqrt(576).
        causal: with seq_len_q > 1, query i sees the first L - seq_len_q + i + 1 keys
            (bottom-right); without it every query sees all L keys.
    Returns:
        out: (batch_size, seq_len_q, num_heads_q, 512) bfloat16.
        softmax_lse: (batch_size, num_heads_q, seq_len_q) float32, natural log.
    """
    if not _ops.native_available():
        raise RuntimeError(_ops.LOAD_ERROR)
    if q.dim() != 4 or q.shape[-1] != _HEAD_DIM:
        raise ValueError(f"flash_mla_with_kvcache: q must be (batch, seq_len_q, num_heads, {_HEAD_DIM}), "
                         f"got {tuple(q.shape)}")
    if head_dim_v != _HEAD_DIM_V:
        raise ValueError(f"flash_mla_with_kvcache: head_dim_v must be {_HEAD_DIM_V}, got {head_dim_v}")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != _HEAD_DIM:
        raise ValueError(f"flash_mla_with_kvcache: k_cache must be (num_blocks, page_block_size, 1, {_HEAD_DIM}), "
                         f"got {tuple(k_cache.shape)}")
    if k_cache.dtype != torch.bfloat16:
        raise ValueError(f"flash_mla_with_kvcache: k_cache must be bfloat16 here, got {k_cache.dtype} (FlashMLA's "
                         "fp8 cache layout is not supported; mla_decode.decode takes fp8 and MXFP4 caches)")
    batch, s_q, heads, _ = q.shape
    if block_table.shape[0] != batch or cache_seqlens.shape != (batch,):
        raise ValueError(f"flash_mla_with_kvcache: block_table ({tuple(block_table.shape)}) and cache_seqlens "
                         f"({tuple(cache_seqlens.shape)}) must have batch_size={batch} rows")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(_HEAD_DIM)
    page = k_cache.shape[1]
    q_flat = q.reshape(batch * s_q, heads, _HEAD_DIM)
    if causal or s_q == 1:
        qo_indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=q.device) * s_q
        table, lens = block_table, cache_seqlens
    else:
        # Non-causal multi-token queries: every query token is its own item
        # over the same pages, so it sees all keys of its sequence.
        qo_indptr = torch.arange(0, batch * s_q + 1, dtype=torch.int32, device=q.device)
        table = block_table.repeat_interleave(s_q, dim=0)
        lens = cache_seqlens.repeat_interleave(s_q)
    out, lse = torch.ops.mla_decode.decode(q_flat, k_cache, None, qo_indptr, None, None, table, lens, page,
                                           float(scale), 0)
    return (out.view(batch, s_q, heads, _HEAD_DIM_V),
            lse.view(batch, s_q, heads).transpose(1, 2).contiguous())
