"""mla_decode.flash_mla in both of FlashMLA's interfaces (the older three-argument metadata call
and the current no-argument one) against the float64 reference: paged cache of block 64, ragged
cache_seqlens with an empty sequence, s_q 1 and 2 with and without causal, FlashMLA's
conventions (+inf LSE for a query that sees no key)."""

import math
import types

import pytest
import torch

from mla_decode import flash_mla
from mla_decode.flash_mla import MLASchedMeta, flash_mla_with_kvcache, get_mla_metadata
from mla_decode.reference import reference_decode

PAGE = 64


def make_inputs(batch, s_q, heads, lens, seed):
    """FlashMLA-style inputs: shuffled blocks of 64; every block slot past a sequence's length,
    and every block no sequence owns, holds NaN; block-table entries past a sequence's blocks
    hold a huge block number (never to be read)."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // PAGE) for n in lens) + 1
    num_blocks = batch * max_blocks + 2
    k_cache = torch.randn(num_blocks, PAGE, 1, 576, generator=g).to(torch.bfloat16)
    perm = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].to(torch.int32)
    table = perm.view(batch, max_blocks).clone()
    owned = torch.zeros(num_blocks, PAGE, dtype=torch.bool)
    for b, n in enumerate(lens):
        for blk in range(-(-n // PAGE)):
            owned[table[b, blk], : min(PAGE, n - blk * PAGE)] = True
        table[b, -(-n // PAGE):] = 2147480000
    k_cache[~owned] = float("nan")
    q = (torch.randn(batch, s_q, heads, 576, generator=g) / 4).to(torch.bfloat16)
    return q, k_cache, table, torch.tensor(lens, dtype=torch.int32)


def reference(q, k_cache, table, lens, causal):
    """float64 (out (b, s_q, h, 512), lse (b, h, s_q)) with FlashMLA's +inf for no key."""
    batch, s_q, heads, _ = q.shape
    rows = k_cache.view(-1, 576).double()
    scale = 576 ** -0.5
    q3 = q.reshape(-1, heads, 576)
    if causal or s_q == 1:
        out, lse = reference_decode(q3, rows, torch.arange(batch + 1) * s_q, scale, block_table=table,
                                    kv_lens=lens, page_size=PAGE)
    else:
        out, lse = reference_decode(q3, rows, torch.arange(batch * s_q + 1), scale,
                                    block_table=table.repeat_interleave(s_q, 0),
                                    kv_lens=lens.repeat_interleave(s_q), page_size=PAGE)
    lse = lse.view(batch, s_q, heads).transpose(1, 2)
    return out.view(batch, s_q, heads, 512), torch.where(torch.isinf(lse), torch.full_like(lse, math.inf), lse)


def check(out, lse, ref, ref_lse):
    batch, s_q, heads, _ = ref.shape
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (batch, s_q, heads, 512)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (batch, heads, s_q)
    out, lse = out.cpu().double(), lse.cpu().double()
    assert torch.isfinite(out).all()
    empty = torch.isinf(ref_lse)                                   # (b, h, s_q)
    assert torch.equal(torch.isposinf(lse), empty), "a query that sees no key has lse = +inf, the others finite"
    seen = ~empty.transpose(1, 2)                                  # (b, s_q, h)
    assert (out[~seen] == 0).all()
    rel = float((out[seen] - ref[seen]).norm() / ref[seen].norm())
    assert rel < 8e-3, rel
    assert float((lse[~empty] - ref_lse[~empty]).abs().max()) < 2e-3


STYLES = ("three-argument", "current")
CASES = [(s_q, causal) for s_q in (1, 2) for causal in (False, True)]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("s_q,causal", CASES)
@pytest.mark.parametrize("heads", [16, 128])
def test_both_interfaces_against_float64(device, style, s_q, causal, heads):
    lens = [70, 0, 1, 129, 64]
    q, k_cache, table, seqlens = make_inputs(len(lens), s_q, heads, lens, seed=s_q * 10 + causal + heads)
    ref, ref_lse = reference(q, k_cache, table, seqlens, causal)
    dq, dk, dt, dl = (t.to(device) for t in (q, k_cache, table, seqlens))
    if style == "current":
        meta, splits = get_mla_metadata()
        assert isinstance(meta, MLASchedMeta) and splits is None and not meta.have_initialized
    else:
        meta, splits = get_mla_metadata(dl, s_q * heads, 1)
        assert meta.dtype == torch.int32 and splits.dtype == torch.int32 and splits.shape == (len(lens) + 1,)
    for _ in range(2):   # the current interface fills the object on the first call, reuses it on the second
        out, lse = flash_mla_with_kvcache(dq, dk, dt, dl, 512, meta, splits, causal=causal)
        check(out, lse, ref, ref_lse)
    if style == "current":
        assert meta.have_initialized and meta.config.b == len(lens) and meta.config.s_q == s_q
        assert meta.config.causal == causal and meta.config.page_block_size == PAGE


def test_causal_lonely_queries_get_plus_inf():
    """s_q 2 over a one-key sequence with causal: the first query sees no key (FlashMLA: out 0,
    lse +inf), the second sees the key."""
    q, k_cache, table, seqlens = make_inputs(1, 2, 16, [1], seed=3)
    meta, _ = get_mla_metadata()
    out, lse = flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, None, causal=True)
    assert torch.isposinf(lse[0, :, 0]).all() and (out[0, 0] == 0).all()
    assert torch.isfinite(lse[0, :, 1]).all()
    ref, ref_lse = reference(q, k_cache, table, seqlens, True)
    check(out, lse, ref, ref_lse)


def test_metadata_object_is_tied_to_its_configuration():
    q, k_cache, table, seqlens = make_inputs(2, 1, 16, [64, 5], seed=1)
    meta, _ = get_mla_metadata()
    flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, None)
    with pytest.raises(ValueError, match="filled by a call with causal=False, this call has causal=True"):
        flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, None, causal=True)
    with pytest.raises(ValueError, match="h_q=16, this call has h_q=8"):
        flash_mla_with_kvcache(q[:, :, :8].contiguous(), k_cache, table, seqlens, 512, meta, None)
    with pytest.raises(ValueError, match="num_splits must be None"):
        flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, get_mla_metadata()[0], torch.zeros(3, dtype=torch.int32))


def test_rejects_what_it_cannot_do():
    lens = torch.tensor([5], dtype=torch.int32)
    meta, splits = get_mla_metadata(lens, 16, 1)
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    k = torch.zeros(2, 64, 1, 576, dtype=torch.bfloat16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim_v must be 512, got 128"):
        flash_mla_with_kvcache(q, k, table, lens, 128, meta, splits)
    with pytest.raises(ValueError, match="fp8 cache layout is not supported"):
        flash_mla_with_kvcache(q, k.to(torch.float8_e4m3fn), table, lens, 512, meta, splits)
    with pytest.raises(ValueError, match="is_fp8_kvcache=True"):
        flash_mla_with_kvcache(q, k, table, lens, 512, meta, splits, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match="sparse attention is not supported here; indices must be None"):
        flash_mla_with_kvcache(q, k, table, lens, 512, meta, splits, indices=torch.zeros(1, 1, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="one latent KV head"):
        flash_mla_with_kvcache(q, torch.zeros(2, 64, 2, 576, dtype=torch.bfloat16), table, lens, 512, meta, splits)
    with pytest.raises(ValueError, match="num_heads_k=1"):
        get_mla_metadata(lens, 16, 2)
    with pytest.raises(TypeError, match="no arguments .* or with all three"):
        get_mla_metadata(lens)
    with pytest.raises(TypeError, match="tile_scheduler_metadata must be"):
        flash_mla_with_kvcache(q, k, table, lens, 512, None, None)


def test_benchmark_adapter_drives_both_interfaces():
    """The benchmark's FlashMLA peer on this module (current interface) and on a module with only
    the three-argument metadata call: same outputs, one filled metadata object per input set."""
    from mla_decode.bench.providers import FlashMLAPeer
    from mla_decode.inputs import generate_input

    old_style = types.SimpleNamespace(
        get_mla_metadata=lambda cache_seqlens, num_heads_per_head_k, num_heads_k: flash_mla.get_mla_metadata(
            cache_seqlens, num_heads_per_head_k, num_heads_k),
        flash_mla_with_kvcache=flash_mla.flash_mla_with_kvcache)
    sets = [generate_input(2, 1, 128, seed=s, device="cpu") for s in (0, 1)]
    q0, kv0, qo, kvp, cfg = sets[0]
    outs = {}
    for mod in (flash_mla, old_style):
        peer = FlashMLAPeer()
        peer.mod, peer.api = mod, FlashMLAPeer.interface(mod.get_mla_metadata)
        states = peer.prepare([(s[0], s[1]["bf16"]) for s in sets], qo, kvp, cfg)
        if peer.api == "current":
            assert all(st["meta"].have_initialized for st in states)
            assert states[0]["meta"] is not states[1]["meta"] and states[0]["splits"] is None
        outs[peer.api] = [peer.call(st) for st in states]
    assert set(outs) == {"current", "three-argument"}
    for a, b in zip(outs["current"], outs["three-argument"]):
        assert torch.equal(a, b)
    ref, _ = reference_decode(q0, kv0["bf16"].view(-1, 576), qo, cfg["sm_scale"], kv_indptr=kvp)
    assert float((outs["current"][0].double() - ref).norm() / ref.norm()) < 8e-3
