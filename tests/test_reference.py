"""reference_decode against a naive per-row Python float64 loop; dequantize_cache; rel_error."""

import math

import pytest
import torch

from mla_decode.inputs import generate_input, make_paged_cache, make_ragged_indptr
from mla_decode.quant import dequantize_fp8, dequantize_mxfp4, quantize_fp8, quantize_mxfp4
from mla_decode.reference import (
    dequantize_cache,
    reference_custom_kernel,
    reference_decode,
    rel_error,
)

D = 576
DV = 512


def naive_decode(q, key_rows_per_item, qo, sm_scale):
    """Scalar loop: key_rows_per_item[b] is a list of (D,) float64 rows, in key order."""
    q = q.double()
    total_q, H, _ = q.shape
    out = torch.zeros(total_q, H, DV, dtype=torch.float64)
    lse = torch.full((total_q, H), -math.inf, dtype=torch.float64)
    for b in range(len(qo) - 1):
        keys = key_rows_per_item[b]
        L = len(keys)
        nq = qo[b + 1] - qo[b]
        for i in range(nq):
            t = qo[b] + i
            visible = L - nq + i + 1 if nq > 1 else L
            visible = max(0, min(L, visible))
            for h in range(H):
                if visible == 0:
                    continue
                s = [sm_scale * float(torch.dot(q[t, h], keys[j])) for j in range(visible)]
                m = max(s)
                w = [math.exp(v - m) for v in s]
                tot = sum(w)
                acc = torch.zeros(DV, dtype=torch.float64)
                for j in range(visible):
                    acc += (w[j] / tot) * keys[j][:DV]
                out[t, h] = acc
                lse[t, h] = m + math.log(tot)
    return out, lse


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def check(out, lse, ref_out, ref_lse):
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert torch.allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert torch.equal(lse[~fin], ref_lse[~fin])           # both -inf
    assert torch.allclose(lse[fin], ref_lse[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("H", [1, 3])
@pytest.mark.parametrize("q_len", [1, 3])
def test_indptr_ragged(H, q_len):
    kv_lens = [5, 0, 2, 7, 1]
    B = len(kv_lens)
    kvp = make_ragged_indptr(kv_lens)
    qo = [q_len * b for b in range(B + 1)]
    kv = rand(sum(kv_lens), D, seed=1) * 0.5
    q = rand(qo[-1], H, D, seed=2) * 0.5
    sm = 1.0 / 24.0
    out, lse = reference_decode(q.float(), kv.float(), torch.tensor(qo, dtype=torch.int32), sm,
                                kv_indptr=kvp)
    kvf = kv.float().double()
    keys = [[kvf[r] for r in range(int(kvp[b]), int(kvp[b + 1]))] for b in range(B)]
    ref_out, ref_lse = naive_decode(q.float(), keys, qo, sm)
    check(out, lse, ref_out, ref_lse)
    # item 1 has no keys: its rows are exactly 0 / -inf
    rows = slice(qo[1], qo[2])
    assert out[rows].eq(0).all() and torch.isneginf(lse[rows]).all()
    if q_len == 3:
        # item 4 has L=1 < Q=3: queries 0 and 1 see nothing, query 2 sees key 0
        t = qo[4]
        assert out[t:t + 2].eq(0).all() and torch.isneginf(lse[t:t + 2]).all()
        assert torch.allclose(out[t + 2], kvf[int(kvp[4])][:DV].expand(H, DV), rtol=0, atol=1e-12)


def test_ragged_queries_and_uncovered_rows():
    # q lens 2, 0, 1 ; kv lens 3, 4, 0 ; qo covers only 3 of 4 query rows
    qo = [0, 2, 2, 3]
    kv_lens = [3, 4, 0]
    kvp = make_ragged_indptr(kv_lens)
    q = rand(4, 2, D, seed=3)
    kv = rand(7, D, seed=4)
    out, lse = reference_decode(q, kv, torch.tensor(qo), 0.1, kv_indptr=kvp)
    keys = [[kv[r] for r in range(int(kvp[b]), int(kvp[b + 1]))] for b in range(3)]
    ref_out, ref_lse = naive_decode(q[:3], keys, qo, 0.1)
    check(out[:3], lse[:3], ref_out, ref_lse)
    assert out[2].eq(0).all() and torch.isneginf(lse[2]).all()     # item 2: no keys
    assert out[3].eq(0).all() and torch.isneginf(lse[3]).all()     # not owned by any item


@pytest.mark.parametrize("q_len", [1, 3])
def test_kv_indices(q_len):
    H = 3
    kv_lens = [4, 0, 6]
    kvp = make_ragged_indptr(kv_lens)
    pool = rand(20, D, seed=5)
    g = torch.Generator().manual_seed(6)
    indices = torch.randperm(20, generator=g)[: sum(kv_lens)].to(torch.int32)
    qo = [q_len * b for b in range(4)]
    q = rand(qo[-1], H, D, seed=7)
    out, lse = reference_decode(q, pool, qo, 0.05, kv_indptr=kvp, kv_indices=indices)
    keys = [[pool[int(indices[r])] for r in range(int(kvp[b]), int(kvp[b + 1]))] for b in range(3)]
    ref_out, ref_lse = naive_decode(q, keys, qo, 0.05)
    check(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("q_len", [1, 3])
def test_paged_shuffled(page_size, q_len):
    H = 3
    kv_lens = [5, 0, 9, 2]
    kvp = make_ragged_indptr(kv_lens)
    kv = rand(sum(kv_lens), D, seed=8)
    pages, table, lens = make_paged_cache(kv, kvp, page_size, seed=9, extra_pages=2)
    assert pages.shape[1] == page_size
    # pages really are shuffled (not the identity layout)
    used = table[table >= 0].tolist()
    assert used != list(range(len(used)))
    qo = [q_len * b for b in range(5)]
    q = rand(qo[-1], H, D, seed=10)
    out, lse = reference_decode(q, pages.reshape(-1, D), qo, 0.05, block_table=table,
                                kv_lens=lens, page_size=page_size)
    keys = [[kv[r] for r in range(int(kvp[b]), int(kvp[b + 1]))] for b in range(4)]
    ref_out, ref_lse = naive_decode(q, keys, qo, 0.05)
    check(out, lse, ref_out, ref_lse)
    assert not torch.isnan(out).any()      # NaN-filled unused page slots were never read
    # same answer from the contiguous layout
    out2, lse2 = reference_decode(q, kv, qo, 0.05, kv_indptr=kvp)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_large_scores_stable():
    # scores ~ 1e3: naive exp would overflow; LSE must stay finite and exact
    q = torch.zeros(1, 1, D, dtype=torch.float64)
    q[0, 0, 0] = 1.0
    kv = torch.zeros(3, D, dtype=torch.float64)
    kv[:, 0] = torch.tensor([1000.0, 999.0, 990.0])
    kv[:, 1] = torch.tensor([1.0, 2.0, 3.0])
    out, lse = reference_decode(q, kv, [0, 1], 1.0, kv_indptr=[0, 3])
    w = torch.tensor([0.0, -1.0, -10.0], dtype=torch.float64)
    expect_lse = 1000.0 + math.log(sum(math.exp(v) for v in w.tolist()))
    assert lse[0, 0].item() == pytest.approx(expect_lse, rel=1e-15)
    p = torch.softmax(w, 0)
    assert out[0, 0, 1].item() == pytest.approx(float(p @ torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)), rel=1e-14)


# ---------------------------------------------------------------------------------------
# dequantize_cache
# ---------------------------------------------------------------------------------------

def test_dequantize_cache_formats_and_shapes():
    kv = torch.randn(12, 1, D, generator=torch.Generator().manual_seed(11)).bfloat16()
    base = kv.float().reshape(12, D)
    for shape in [(12, D), (12, 1, D), (3, 4, D), (3, 4, 1, D)]:
        assert torch.equal(dequantize_cache(kv.reshape(shape)), base)
    assert dequantize_cache(kv).dtype == torch.float32
    assert dequantize_cache(kv, dtype=torch.float64).dtype == torch.float64

    for dt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        f, sc = quantize_fp8(kv, dt)
        ref = dequantize_fp8(f, sc).reshape(12, D)
        for shape in [(12, D), (12, 1, D), (3, 4, D), (3, 4, 1, D)]:
            assert torch.equal(dequantize_cache(f.reshape(shape), sc), ref)
        exact = dequantize_cache(f, sc, dtype=torch.float64)
        assert torch.equal(exact, f.double().reshape(12, D) * sc.double())

    p, s = quantize_mxfp4(kv)
    ref = dequantize_mxfp4(p, s).reshape(12, D)
    for shape in [(12, 288), (12, 1, 288), (3, 4, 288), (3, 4, 1, 288)]:
        assert torch.equal(dequantize_cache(p.reshape(shape), s), ref)
    pp, sp = quantize_mxfp4(kv, scale_pad=True)
    assert torch.equal(dequantize_cache(pp, sp), ref)
    pv, sv = quantize_mxfp4(kv, scale_pad="view", pad_fill="random")
    assert torch.equal(dequantize_cache(pv, sv), ref)

    with pytest.raises(ValueError):
        dequantize_cache(f)          # fp8 without scale
    with pytest.raises(ValueError):
        dequantize_cache(kv, sc)     # bf16 with a scale


def test_dequantize_cache_paged_mxfp4():
    kv = torch.randn(10, 1, D, generator=torch.Generator().manual_seed(12)).bfloat16()
    p, s = quantize_mxfp4(kv)
    kvp = make_ragged_indptr([6, 4])
    pages_p, table, lens = make_paged_cache(p.reshape(10, 288), kvp, 4, seed=3)
    pages_s, table_s, _ = make_paged_cache(s, kvp, 4, seed=3)
    assert torch.equal(table, table_s)
    rows = dequantize_cache(pages_p, pages_s)             # (pages*4, 576)
    ref = dequantize_mxfp4(p, s).reshape(10, D)
    flat = []
    for b in range(2):
        for j in range(int(lens[b])):
            flat.append(rows[int(table[b, j // 4]) * 4 + j % 4])
    assert torch.equal(torch.stack(flat), ref)


# ---------------------------------------------------------------------------------------
# reference_custom_kernel and rel_error
# ---------------------------------------------------------------------------------------

def test_reference_custom_kernel_matches_naive():
    data = generate_input(2, 1, 6, seed=21, device="cpu", num_heads=2)
    q, kv_data, qo, kvp, cfg = data
    out = reference_custom_kernel(data)
    assert out.shape == (2, 2, 512) and out.dtype == torch.bfloat16 and out.device == q.device
    kvf = kv_data["bf16"].double().reshape(-1, D)
    keys = [[kvf[r] for r in range(int(kvp[b]), int(kvp[b + 1]))] for b in range(2)]
    ref_out, _ = naive_decode(q, keys, qo.tolist(), cfg["sm_scale"])
    assert torch.equal(out, ref_out.to(torch.bfloat16))
    for fmt in ("fp8", "mxfp4"):
        o = reference_custom_kernel(data, kv_format=fmt)
        assert o.shape == out.shape and torch.isfinite(o.float()).all()
        assert rel_error(o, ref_out) < (0.05 if fmt == "fp8" else 0.2)


def test_rel_error():
    ref = torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64)
    assert rel_error(ref.clone(), ref) == 0.0
    assert rel_error(torch.tensor([3.0, 4.0, 5.0]), ref) == pytest.approx(1.0)
    assert rel_error(torch.tensor([3.0, float("nan"), 0.0]), ref) == math.inf
    ref_nan = torch.tensor([float("nan"), 4.0, 0.0])
    assert rel_error(torch.tensor([float("nan"), 4.0, 0.0]), ref_nan) == 0.0
    assert rel_error(torch.tensor([1.0, 4.0, 0.0]), ref_nan) == math.inf
    assert rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert rel_error(torch.ones(3), torch.zeros(3)) == math.inf
    assert rel_error(torch.tensor([3.0, 4.0, 0.0]).bfloat16(), ref) == 0.0
