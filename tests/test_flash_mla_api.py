"""The FlashMLA-compatible API against the float64 reference."""

import math

import pytest
import torch

from mla_decode.flash_mla import flash_mla_with_kvcache, get_mla_metadata
from mla_decode.reference import reference_decode


@pytest.mark.parametrize("s_q,causal", [(1, False), (2, True), (3, False)])
def test_flash_mla_with_kvcache(device, s_q, causal):
    g = torch.Generator().manual_seed(s_q * 10 + causal)
    batch, heads, page = 3, 16, 64
    lens = torch.tensor([70, 1, 129], dtype=torch.int32)
    max_pages = 3
    num_blocks = batch * max_pages + 2
    k_cache = torch.randn(num_blocks, page, 1, 576, generator=g).to(torch.bfloat16)
    perm = torch.randperm(num_blocks, generator=g)[: batch * max_pages].to(torch.int32)
    table = perm.view(batch, max_pages)
    q = torch.randn(batch, s_q, heads, 576, generator=g).to(torch.bfloat16)
    meta, splits = get_mla_metadata(lens.to(device), s_q * heads, 1)
    out, lse = flash_mla_with_kvcache(q.to(device), k_cache.to(device), table.to(device), lens.to(device), 512,
                                      meta, splits, causal=causal)
    assert out.shape == (batch, s_q, heads, 512) and lse.shape == (batch, heads, s_q)

    rows = k_cache.view(-1, 576).float()
    scale = 1 / math.sqrt(576)
    if causal or s_q == 1:
        ref, ref_lse = reference_decode(q.view(-1, heads, 576), rows, torch.arange(batch + 1) * s_q, scale,
                                        block_table=table, kv_lens=lens, page_size=page)
    else:
        ref, ref_lse = reference_decode(q.view(-1, heads, 576), rows, torch.arange(batch * s_q + 1), scale,
                                        block_table=table.repeat_interleave(s_q, 0),
                                        kv_lens=lens.repeat_interleave(s_q), page_size=page)
    ref = ref.view(batch, s_q, heads, 512)
    ref_lse = ref_lse.view(batch, s_q, heads).transpose(1, 2)
    rel = float((out.cpu().double() - ref).norm() / ref.norm())
    assert rel < 8e-3, rel
    fin = torch.isfinite(ref_lse)
    assert float((lse.cpu().double()[fin] - ref_lse[fin]).abs().max()) < 2e-3
    assert torch.equal(torch.isinf(lse.cpu()), ~fin)


def test_flash_mla_rejects_what_it_cannot_do():
    lens = torch.tensor([5], dtype=torch.int32)
    meta, splits = get_mla_metadata(lens, 16, 1)
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    k = torch.zeros(2, 64, 1, 576, dtype=torch.bfloat16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim_v must be 512"):
        flash_mla_with_kvcache(q, k, table, lens, 128, meta, splits)
    with pytest.raises(ValueError, match="fp8 cache layout is not supported"):
        flash_mla_with_kvcache(q, k.to(torch.float8_e4m3fn), table, lens, 512, meta, splits)
    with pytest.raises(ValueError, match="num_heads_k=1"):
        get_mla_metadata(lens, 16, 2)
