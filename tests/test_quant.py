"""Byte-level tests of the FP8 / MXFP4 quantisers and of generate_input.

Expected bytes are worked out by hand in the comments (see docs/formats.md), not taken from
round trips.  CPU only, fast.
"""

import math

import pytest
import torch

from mla_decode.quant import (
    E2M1_VALUES,
    E8M0_DTYPE,
    FP4_DTYPE,
    dequantize_fp8,
    dequantize_mxfp4,
    e8m0_to_float,
    quantize_fp8,
    quantize_mxfp4,
)
from mla_decode.inputs import (
    generate_input,
    generate_ragged_input,
    make_ragged_indptr,
    random_lengths,
)


def rel_fro(a, b):
    a = a.double()
    b = b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def row_with_block0(vals, dtype=torch.float32, width=576):
    """(1, width) row: block 0 holds `vals` (padded with zeros to 32), the rest zero."""
    x = torch.zeros(1, width, dtype=torch.float32)
    x[0, : len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return x.to(dtype)


def nibbles(kv_fp4, row=0, count=32):
    u = kv_fp4.view(torch.uint8).reshape(-1, kv_fp4.shape[-1])[row]
    out = []
    for i in range(count):
        b = int(u[i // 2])
        out.append(b & 0xF if i % 2 == 0 else b >> 4)
    return out


# ---------------------------------------------------------------------------------------
# E2M1 code table and nibble order (decoder side)
# ---------------------------------------------------------------------------------------

def test_e2m1_code_table_decode():
    # byte k (k < 8) packs code 2k (low nibble) and 2k+1 (high nibble): 0x10, 0x32, ..., 0xFE
    packed = torch.zeros(1, 288, dtype=torch.uint8)
    for k in range(8):
        packed[0, k] = (2 * k) | ((2 * k + 1) << 4)
    assert packed[0, :8].tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    scale = torch.full((1, 18), 127, dtype=torch.uint8)  # 2^0
    out = dequantize_mxfp4(packed, scale)
    assert out.dtype == torch.float32 and out.shape == (1, 576)
    expect = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert out[0, :16].tolist() == expect
    assert list(E2M1_VALUES) == expect
    # code 8 is negative zero
    assert torch.signbit(out[0, 8]) and not torch.signbit(out[0, 0])
    # the float4 dtype view decodes identically
    if FP4_DTYPE is not None:
        assert torch.equal(dequantize_mxfp4(packed.view(FP4_DTYPE), scale), out)


def test_e8m0_decode_exact():
    b = torch.tensor([0, 1, 2, 126, 127, 128, 254, 255], dtype=torch.uint8)
    f = e8m0_to_float(b)
    assert f[0].item() == 2.0 ** -127          # fp32 subnormal, exact
    assert f[0].view(torch.int32).item() == 0x00400000
    assert f[1].item() == 2.0 ** -126
    assert f[2].item() == 2.0 ** -125
    assert f[3].item() == 0.5 and f[4].item() == 1.0 and f[5].item() == 2.0
    assert f[6].item() == 2.0 ** 127
    assert math.isnan(f[7].item())
    if E8M0_DTYPE is not None:
        assert torch.equal(e8m0_to_float(b.view(E8M0_DTYPE)).nan_to_num(0.0), f.nan_to_num(0.0))
    # byte 0 times every E2M1 value is exact in fp32
    packed = torch.zeros(1, 16, dtype=torch.uint8)
    packed[0, 0] = 0x71  # codes 1 (0.5) and 7 (6.0)
    out = dequantize_mxfp4(packed, torch.zeros(1, 1, dtype=torch.uint8))
    assert out[0, 0].item() == 2.0 ** -128 and out[0, 1].item() == 6.0 * 2.0 ** -127
    # 0xFF scale -> whole block NaN
    out = dequantize_mxfp4(packed, torch.full((1, 1), 255, dtype=torch.uint8))
    assert torch.isnan(out).all()


# ---------------------------------------------------------------------------------------
# Quantiser: nibble order, E2M1 rounding, saturation, E8M0 rule
# ---------------------------------------------------------------------------------------

def test_nibble_order_crafted_row():
    # block amax 6 -> bits 0x40C00000 + 0x200000 = 0x40E00000 & 0xFF800000 = 4.0 -> e = 2-2 = 0
    # so elements are encoded unscaled.  element 0 = 0.5 (code 1), element 1 = -6 (code 0xF),
    # element 2 = 2 (code 4), element 3 = 0 (code 0), element 4 = -1 (code 0xA), element 5 = 3 (5)
    x = row_with_block0([0.5, -6.0, 2.0, 0.0, -1.0, 3.0])
    p, s = quantize_mxfp4(x)
    assert p.dtype == torch.uint8 and p.shape == (1, 288)
    assert s.dtype == torch.uint8 and s.shape == (1, 18)
    assert p[0, :3].tolist() == [0xF1, 0x04, 0x5A]
    assert p[0, 3:].eq(0).all()
    assert s[0, 0].item() == 127
    # all-zero blocks: log2(0) = -inf -> e clamped to -127 -> byte 0
    assert s[0, 1:].eq(0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_e2m1_ties_to_even_and_saturation(dtype):
    # amax 6 -> e = 0 (scale 1): value -> nearest E2M1, ties to the even code
    vals = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 6.0, 0.24, 0.26, 4.9, 5.01,
            -0.25, -2.5, -3.5, -5.0, 0.0]
    expect_codes = [
        0,      # 0.25: tie 0 / 0.5  -> code 0 (even)
        2,      # 0.75: tie 0.5 / 1  -> code 2 (1.0)
        2,      # 1.25: tie 1 / 1.5  -> code 2 (1.0)
        4,      # 1.75: tie 1.5 / 2  -> code 4 (2.0)
        4,      # 2.5:  tie 2 / 3    -> code 4 (2.0)
        6,      # 3.5:  tie 3 / 4    -> code 6 (4.0)
        6,      # 5.0:  tie 4 / 6    -> code 6 (4.0)
        7,      # 5.5 -> 6
        7,      # 6.0 -> 6
        0, 1,   # 0.24 -> 0, 0.26 -> 0.5
        6, 7,   # 4.9 -> 4, 5.01 -> 6
        8,      # -0.25 -> -0 (sign kept, magnitude 0)
        0xC,    # -2.5 -> -2
        0xE,    # -3.5 -> -4
        0xE,    # -5 -> -4
        0,
    ]
    x = row_with_block0(vals, dtype)
    if dtype == torch.bfloat16:
        # 0.24, 0.26, 4.9, 5.01 are not bf16 values; recompute their expectation from the
        # bf16 value actually stored (0.240234375 -> 0, 0.259765625 -> 1, 4.90625 -> 6, 5.0 -> 6)
        expect_codes[9:13] = [0, 1, 6, 6]
    p, s = quantize_mxfp4(x)
    assert s[0, 0].item() == 127
    assert nibbles(p, count=len(vals)) == expect_codes


def test_e2m1_saturation_at_6():
    # amax 6.5 = 1.625 * 4: + 0x200000 gives mantissa 1.875 < 2, mask -> 4.0, e = 0.
    # 6.5 itself is then above the E2M1 max and saturates to 6 (code 7); -6.5 -> 0xF.
    x = row_with_block0([6.5, -6.5, 1.0])
    p, s = quantize_mxfp4(x)
    assert s[0, 0].item() == 127
    assert p[0, 0].item() == 0xF7 and p[0, 1].item() == 0x02
    d = dequantize_mxfp4(p, s)
    assert d[0, :3].tolist() == [6.0, -6.0, 1.0]


def test_e8m0_rounding_rule():
    # amax 1.75 = 0x3FE00000; + 0x200000 = 0x40000000 = 2.0 -> e = 1 - 2 = -1 -> byte 126.
    #   1.75 * 2^1 = 3.5 -> tie 3/4 -> 4.0 (code 6): dequantises to 2.0
    # amax 1.74 = 0x3FDEB852; + 0x200000 = 0x3FFEB852 & 0xFF800000 = 1.0 -> e = -2 -> byte 125.
    #   1.74 * 2^2 = 6.96 -> saturates to 6 (code 7): dequantises to 1.5
    assert torch.tensor(1.74, dtype=torch.float32).view(torch.int32).item() == 0x3FDEB852
    x = torch.zeros(2, 576)
    x[0, 0] = 1.75
    x[1, 0] = 1.74
    x[0, 32] = 1.5      # mantissa 1.5 < 1.75: 0x3FC00000 + 0x200000 = 0x3FE00000 -> 1.0 -> e=-2 -> 125
    x[1, 32] = -7.0     # 1.75 * 4 rounds up to 8: e = 3 - 2 = 1 -> byte 128; 7/2 = 3.5 -> 4 (0xE)
    x[0, 64] = 2.0 ** -140   # fp32 subnormal amax: rounded bits keep exponent field 0 -> e=-127
    x[1, 64] = 1e30          # 0x7149F2CA -> +0x200000 = 0x714BF2CA -> 2^99 -> e = 97 -> 224
    p, s = quantize_mxfp4(x)
    assert s[0, 0].item() == 126 and s[1, 0].item() == 125
    assert nibbles(p, 0, 1) == [6] and nibbles(p, 1, 1) == [7]
    d = dequantize_mxfp4(p, s)
    assert d[0, 0].item() == 2.0 and d[1, 0].item() == 1.5
    assert s[0, 1].item() == 125 and s[1, 1].item() == 128
    assert d[0, 32].item() == 1.5 and d[1, 32].item() == -8.0
    assert s[0, 2].item() == 0 and p[0, 32].item() == 0        # 2^-140 * 2^127 = 2^-13 -> 0
    assert s[1, 2].item() == 224
    assert nibbles(p.reshape(2, 288)[:, 32:], 1, 1) == [7]    # 1e30 / 2^97 = 6.3 -> 6


def test_e8m0_rounding_rule_bf16_input():
    # bf16 1.75 (0x3FE0) vs 1.7421875 (0x3FDF, the bf16 just below): bytes 126 vs 125
    x = torch.zeros(2, 1, 576, dtype=torch.bfloat16)
    x[0, 0, 0] = 1.75
    x[1, 0, 0] = 1.7421875
    p, s = quantize_mxfp4(x)
    assert p.shape == (2, 1, 288) and s.shape == (2, 18)
    assert s[:, 0].tolist() == [126, 125]


def test_negative_zero_and_tiny_negatives_keep_sign_bit():
    # aiter takes the sign from the fp32 bits: -0.0 and negatives that round to 0 give 0x8
    x = row_with_block0([4.0, -0.0, -0.1, 0.1])
    p, _ = quantize_mxfp4(x)
    assert nibbles(p, count=4) == [6, 8, 8, 0]


def test_quantize_mxfp4_dtypes_and_leading_dims():
    x = torch.randn(3, 2, 576, generator=torch.Generator().manual_seed(1)).bfloat16()
    p, s = quantize_mxfp4(x)
    assert p.shape == (3, 2, 288) and s.shape == (6, 18)
    if FP4_DTYPE is not None and E8M0_DTYPE is not None:
        p2, s2 = quantize_mxfp4(x, fp4_dtype=FP4_DTYPE, scale_dtype=E8M0_DTYPE)
        assert p2.dtype == FP4_DTYPE and s2.dtype == E8M0_DTYPE
        assert torch.equal(p2.view(torch.uint8), p) and torch.equal(s2.view(torch.uint8), s)


# ---------------------------------------------------------------------------------------
# Padded / strided scale layout
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pad_fill", [0xFF, "random"])
def test_padded_scale_layout(pad_fill):
    x = torch.randn(5, 1, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    p, s = quantize_mxfp4(x)
    ref = dequantize_mxfp4(p, s)
    assert torch.isfinite(ref).all()

    pp, sp = quantize_mxfp4(x, scale_pad=True, pad_fill=pad_fill)
    assert torch.equal(pp, p)
    assert sp.shape == (256, 24) and sp.stride() == (24, 1)
    assert torch.equal(sp[:5, :18], s)
    if pad_fill == 0xFF:
        assert sp[5:].eq(0xFF).all() and sp[:, 18:].eq(0xFF).all()
    assert torch.equal(dequantize_mxfp4(pp, sp), ref)

    pv, sv = quantize_mxfp4(x, scale_pad="view", pad_fill=pad_fill)
    assert sv.shape == (5, 18) and sv.stride() == (24, 1)
    assert torch.equal(dequantize_mxfp4(pv, sv), ref)

    # a reader that ignores strides (flat row-major 18-wide reads) would be wrong
    flat = sp.reshape(-1)[: 5 * 18].reshape(5, 18)
    assert not torch.equal(flat, s)

    # column-major scale storage is read through its strides too
    s_cm = s.t().contiguous().t()
    assert s_cm.stride() == (1, 5)
    assert torch.equal(dequantize_mxfp4(p, s_cm), ref)

    # E8M0 dtype padded buffer
    if E8M0_DTYPE is not None:
        _, se = quantize_mxfp4(x, scale_pad=True, scale_dtype=E8M0_DTYPE)
        assert se.dtype == E8M0_DTYPE
        assert torch.equal(dequantize_mxfp4(p, se), ref)


def test_scale_too_small_rejected():
    p = torch.zeros(4, 288, dtype=torch.uint8)
    with pytest.raises(ValueError):
        dequantize_mxfp4(p, torch.zeros(3, 18, dtype=torch.uint8))


# ---------------------------------------------------------------------------------------
# FP8
# ---------------------------------------------------------------------------------------

def test_fp8_saturation_e4m3fn():
    # amax = 1.0078125 (bf16 0x3F81).  amax / 448 = 0.0022496 -> bf16 rounds DOWN to
    # 1.1484375 * 2^-9 = 0.0022430419921875, so amax / scale = 449.31 -> bf16 450 > 448:
    # the clamp makes it exactly 448 (and -448 for -amax).
    x = torch.tensor([[1.0078125, -1.0078125, 0.5, 0.0]], dtype=torch.bfloat16)
    f, sc = quantize_fp8(x, torch.float8_e4m3fn)
    assert sc.dtype == torch.float32 and sc.shape == (1,)
    assert sc.item() == 0.0022430419921875
    assert (x / sc.bfloat16())[0, 0].item() == 450.0
    assert f.dtype == torch.float8_e4m3fn
    assert f.float()[0].tolist()[:2] == [448.0, -448.0]
    # 0.5 / 0.0022430419921875 = 222.9 -> bf16 223 -> e4m3fn (ulp 16 in [128,256)) -> 224
    assert f.float()[0, 2].item() == 224.0
    assert f.float()[0, 3].item() == 0.0
    assert f.view(torch.uint8)[0, :2].tolist() == [0x7E, 0xFE]      # +-448 = S.1111.110
    assert dequantize_fp8(f, sc)[0, 0].item() == pytest.approx(448 * 0.0022430419921875, rel=1e-7)


def test_fp8_saturation_e4m3fnuz():
    # amax = 1.09375; /240 -> bf16 1.1640625 * 2^-8 = 0.004547119140625 (rounded down);
    # 1.09375 / that = 240.54 -> bf16 241 > 240 -> clamp 240.
    x = torch.tensor([[1.09375, -1.09375]], dtype=torch.bfloat16)
    f, sc = quantize_fp8(x, torch.float8_e4m3fnuz)
    assert sc.item() == 0.004547119140625
    assert f.dtype == torch.float8_e4m3fnuz
    assert f.float()[0].tolist() == [240.0, -240.0]
    assert not torch.isnan(f.float()).any()


def test_fp8_zero_guard():
    x = torch.zeros(4, 1, 576, dtype=torch.bfloat16)
    f, sc = quantize_fp8(x)
    assert sc.item() > 0 and math.isfinite(sc.item())
    assert f.float().eq(0).all()
    assert dequantize_fp8(f, sc).eq(0).all()


# ---------------------------------------------------------------------------------------
# Round-trip error within the format bounds
# ---------------------------------------------------------------------------------------

def test_roundtrip_error_bounds():
    x = torch.randn(2048, 1, 576, generator=torch.Generator().manual_seed(3)).bfloat16()
    p, s = quantize_mxfp4(x)
    e_mx = rel_fro(dequantize_mxfp4(p, s), x.float())
    assert 0.05 < e_mx < 0.15, e_mx
    for dt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        f, sc = quantize_fp8(x, dt)
        e8 = rel_fro(dequantize_fp8(f, sc), x.float())
        assert 0.01 < e8 < 0.04, (dt, e8)
    pn, sn = quantize_mxfp4(x, method="nearest")
    e_n = rel_fro(dequantize_mxfp4(pn, sn), x.float())
    assert 0.05 < e_n < 0.2, e_n


def test_dequant_error_elementwise_bound():
    # each element is within half an E2M1 step of its block: |err| <= 2^e * 1 (step 2 at [4,6])
    x = torch.randn(256, 576, generator=torch.Generator().manual_seed(4))
    p, s = quantize_mxfp4(x)
    d = dequantize_mxfp4(p, s)
    scale = e8m0_to_float(s).repeat_interleave(32, dim=1)
    assert ((d - x).abs() <= scale * 1.0 + 1e-30).all()


# ---------------------------------------------------------------------------------------
# generate_input
# ---------------------------------------------------------------------------------------

def test_generate_input_shapes_and_dtypes():
    q, kv, qo, kvp, cfg = generate_input(3, 2, 40, seed=1234, device="cpu")
    assert q.shape == (6, 16, 576) and q.dtype == torch.bfloat16
    assert kv["bf16"].shape == (120, 1, 576) and kv["bf16"].dtype == torch.bfloat16
    f8, sc = kv["fp8"]
    assert f8.shape == (120, 1, 576) and f8.dtype == torch.float8_e4m3fn
    assert sc.shape == (1,) and sc.dtype == torch.float32 and sc.device == q.device
    p, s = kv["mxfp4"]
    assert p.shape == (120, 1, 288)
    assert p.dtype == (FP4_DTYPE or torch.uint8)
    assert s.dim() == 2 and s.shape == (120, 18) and s.dtype == (E8M0_DTYPE or torch.uint8)
    assert qo.dtype == torch.int32 and qo.tolist() == [0, 2, 4, 6]
    assert kvp.dtype == torch.int32 and kvp.tolist() == [0, 40, 80, 120]
    assert cfg == {
        "batch_size": 3, "num_heads": 16, "num_kv_heads": 1, "qk_head_dim": 576,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 512,
        "q_seq_len": 2, "kv_seq_len": 40, "sm_scale": 1.0 / 24.0,
    }
    # q first, then the cache, from one generator seeded with `seed`
    g = torch.Generator(device="cpu")
    g.manual_seed(1234)
    q_exp = torch.randn((6, 16, 576), dtype=torch.bfloat16, generator=g)
    kv_exp = torch.randn((120, 1, 576), dtype=torch.bfloat16, generator=g)
    assert torch.equal(q, q_exp) and torch.equal(kv["bf16"], kv_exp)
    # derived formats come from the bf16 cache
    f8b, scb = quantize_fp8(kv_exp)
    assert torch.equal(f8.view(torch.uint8), f8b.view(torch.uint8)) and torch.equal(sc, scb)
    pb, sb = quantize_mxfp4(kv_exp)
    assert torch.equal(p.view(torch.uint8), pb) and torch.equal(s.view(torch.uint8), sb)
    # num_heads and fp8 flavour options
    q2, kv2, *_ = generate_input(1, 1, 8, seed=1, device="cpu", num_heads=128,
                                 fp8_dtype=torch.float8_e4m3fnuz, native_mx_dtypes=False)
    assert q2.shape == (1, 128, 576) and kv2["fp8"][0].dtype == torch.float8_e4m3fnuz
    assert kv2["mxfp4"][0].dtype == torch.uint8 and kv2["mxfp4"][1].dtype == torch.uint8


def _all_bytes(data):
    q, kv, qo, kvp, _ = data
    ts = [q, kv["bf16"], kv["fp8"][0], kv["fp8"][1], kv["mxfp4"][0], kv["mxfp4"][1], qo, kvp]
    return [t.contiguous().view(torch.uint8) if t.element_size() == 1 else t for t in ts]


def test_generate_input_determinism():
    a = _all_bytes(generate_input(2, 1, 64, seed=7, device="cpu"))
    b = _all_bytes(generate_input(2, 1, 64, seed=7, device="cpu"))
    c = _all_bytes(generate_input(2, 1, 64, seed=8, device="cpu"))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])
    assert not torch.equal(a[4], c[4])


def test_generate_input_variants_and_padding():
    q, kv, *_ = generate_input(2, 1, 16, seed=5, device="cpu", scale_pad=True)
    p, s = kv["mxfp4"]
    assert s.shape == (256, 24)
    ref = dequantize_mxfp4(*quantize_mxfp4(kv["bf16"]))
    assert torch.equal(dequantize_mxfp4(p, s), ref)
    qn, kvn, *_ = generate_input(2, 1, 16, seed=5, device="cpu", variant="nearest")
    assert torch.equal(qn, q * 0.02)
    assert kvn["mxfp4"][0].dtype == torch.uint8 and kvn["mxfp4"][1].shape == (32, 18)


def test_ragged_helpers():
    assert make_ragged_indptr([3, 0, 2]).tolist() == [0, 3, 3, 5]
    assert make_ragged_indptr([3, 0, 2]).dtype == torch.int32
    l1 = random_lengths(8, 10, seed=1, zero_frac=0.3)
    assert l1 == random_lengths(8, 10, seed=1, zero_frac=0.3)
    assert len(l1) == 8 and all(0 <= v <= 10 for v in l1)
    q, kv, qo, kvp, cfg = generate_ragged_input([1, 0, 2], [5, 0, 3], seed=3, device="cpu",
                                                num_heads=2)
    assert q.shape == (3, 2, 576) and kv["bf16"].shape == (8, 1, 576)
    assert qo.tolist() == [0, 1, 1, 3] and kvp.tolist() == [0, 5, 5, 8]
    assert cfg["q_seq_len"] == 2 and cfg["kv_seq_len"] == 5


def test_worked_example_block():
    # the block worked by hand in docs/formats.md: amax 0.875 -> e = -2 -> byte 125 (0x7D)
    vals = [0.875, -0.5, 0.0625, 0.1875, -0.3125, 0.4375, 0.625, -0.75,
            0.125, 0.25, -0.0, 0.03125, 0.375, -0.875, 0.5625, 0.6875,
            -0.125, 0.8125, -0.0625, 0.3125, 0.75, -0.25, 0.5, -0.5625,
            0.0, -0.4375, 0.09375, 0.6875, -0.6875, 0.15625, -0.1875, 0.8125]
    x = row_with_block0(vals, torch.bfloat16)
    p, s = quantize_mxfp4(x)
    assert s[0, 0].item() == 0x7D
    assert nibbles(p) == [0x6, 0xC, 0x0, 0x2, 0xA, 0x4, 0x4, 0xD, 0x1, 0x2, 0x8, 0x0, 0x3, 0xE, 0x4, 0x5,
                          0x9, 0x5, 0x8, 0x2, 0x5, 0xA, 0x4, 0xC, 0x0, 0xC, 0x1, 0x5, 0xD, 0x1, 0xA, 0x5]
    assert bytes(p[0, :16].tolist()).hex(" ").upper() == "C6 20 4A D4 21 08 E3 54 59 28 A5 C4 C0 51 1D 5A"
    d = dequantize_mxfp4(p, s)[0, :16].tolist()
    assert d == [1.0, -0.5, 0.0, 0.25, -0.25, 0.5, 0.5, -0.75, 0.125, 0.25, -0.0, 0.0, 0.375, -1.0, 0.5, 0.75]
