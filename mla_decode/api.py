"""The friendly Python API over torch.ops.mla_decode."""

from __future__ import annotations

import math

import torch

from . import _ops

DEFAULT_SM_SCALE = 1.0 / math.sqrt(576)


def decode(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, *,
           kv_scale: torch.Tensor | None = None,
           kv_indptr: torch.Tensor | None = None,
           kv_indices: torch.Tensor | None = None,
           block_table: torch.Tensor | None = None,
           kv_lens: torch.Tensor | None = None,
           page_size: int = 1,
           sm_scale: float | None = None,
           num_splits: int = 0,
           out: torch.Tensor | None = None,
           lse: torch.Tensor | None = None,
           return_lse: bool = False):
    """Absorbed MLA decode attention over a latent KV cache.

    For query token i of batch item b and head h, with the item's keys K
    (rows of the cache, V = K[:, :512]):

        out[i, h] = softmax(sm_scale * q[i, h] @ K.T) @ K[:, :512]
        lse[i, h] = logsumexp(sm_scale * q[i, h] @ K.T)      (natural log)

    with a bottom-right causal mask when an item has several query tokens
    (query i of Q sees the first L - Q + i + 1 of its L keys). Rows that see
    no key get out = 0 and lse = -inf.

    Shapes and dtypes:
      q           (total_q, H, 576) bfloat16, 1 <= H <= 128; last dim contiguous.
      kv_cache    the cache; its dtype picks the format:
                    bfloat16                 rows of 576 values (1152 bytes)
                    float8_e4m3fn / e4m3fnuz rows of 576 codes; kv_scale: float32 (1,),
                                             value = code * kv_scale
                    uint8 / float4_e2m1fn_x2 rows of 288 bytes, two E2M1 codes per
                                             byte, element 2k in the low nibble of byte
                                             k; kv_scale: E8M0 bytes (rows, >= 18),
                                             value = code * 2^(scale[row, k // 32] - 127)
                  shape (rows, D), (rows, 1, D), or with block_table
                  (pages, page_size, D) / (pages, page_size, 1, D); D = 576 or 288.
      qo_indptr   (B + 1,) int32: item b owns q rows qo_indptr[b]:qo_indptr[b+1].
      kv_indptr   (B + 1,) int32: item b owns tokens kv_indptr[b]:kv_indptr[b+1]
                  (cache rows, or positions in kv_indices when given).
      kv_indices  (N,) int32, optional: cache row of each token position.
      block_table (B, max_pages) int32 with kv_lens (B,) int32 and page_size: paged
                  cache, token j of item b at row block_table[b, j // page_size] *
                  page_size + j % page_size.
      sm_scale    default 1 / sqrt(576).
      num_splits  KV splits per query row on the GPU (0 = automatic).
      out, lse    optional preallocated outputs: (total_q, H, 512) bfloat16 and
                  (total_q, H) float32.

    Returns out, or (out, lse) when return_lse=True.

    On the GPU nothing here synchronises with the host, so calls can be
    captured in CUDA graphs; index tensors are not range-checked there (that
    would need a sync): a token whose index points outside the cache yields
    NaN rows instead of an out-of-bounds read. On the CPU every index is
    checked and a bad one raises.
    """
    if not _ops.native_available():
        raise RuntimeError(_ops.LOAD_ERROR)
    if sm_scale is None:
        sm_scale = DEFAULT_SM_SCALE
    if out is None and lse is None:
        out, lse = torch.ops.mla_decode.decode(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices,
                                               block_table, kv_lens, page_size, float(sm_scale), num_splits)
    else:
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], 512), dtype=torch.bfloat16)
        if lse is None:
            lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
        torch.ops.mla_decode.decode_out(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table,
                                        kv_lens, page_size, float(sm_scale), num_splits, out, lse)
    return (out, lse) if return_lse else out


def info() -> dict:
    """What this build contains: backends, archs, the torch it was built against."""
    b = _ops.BUILD_INFO
    built = {} if b is None else {
        "version": b.VERSION, "backend": b.BACKEND, "torch": b.TORCH_VERSION, "cuda": b.CUDA_VERSION,
        "hip": b.HIP_VERSION, "cuda_archs": b.CUDA_ARCHS, "rocm_archs": b.ROCM_ARCHS}
    backends = torch.ops.mla_decode.backends() if _ops.native_available() else None
    return {"native": _ops.native_available(), "load_error": _ops.LOAD_ERROR, "compiled_backends": backends,
            "built_with": built, "runtime_torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
