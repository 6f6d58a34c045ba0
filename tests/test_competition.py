"""custom_kernel on generated competition inputs (any device), its format
choice, and the observable fallback chain (warn once; raise when strict)."""

import warnings

import pytest
import torch

import mla_decode
from mla_decode import fallback
from mla_decode.inputs import generate_input
from mla_decode.reference import dequantize_cache, reference_decode


def exact_bf16(data):
    q, kv_data, qo, kvp, config = data
    ref, _ = reference_decode(q.cpu(), dequantize_cache(kv_data["bf16"].cpu()), qo.cpu(), config["sm_scale"],
                              kv_indptr=kvp.cpu())
    return ref


# Error against exact math on the bf16 cache: each format's own quantisation
# error plus the kernel's ~2e-3 (docs/formats.md, README).
FORMAT_ERROR_BOUND = {"bf16": 8e-3, "fp8": 6e-2, "mxfp4": 0.2}


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_custom_kernel_matches_exact_math(device, fmt, monkeypatch):
    monkeypatch.setenv("MLA_DECODE_FORMAT", fmt)
    monkeypatch.setenv("MLA_DECODE_STRICT", "1")  # the native path must be the one that runs
    data = generate_input(4, 1, 256, seed=7, device=device)
    out = mla_decode.custom_kernel(data)
    assert out.shape == (4, 16, 512) and out.dtype == torch.bfloat16 and out.device.type == device.type
    ref = exact_bf16(data)
    rel = float((out.cpu().double() - ref).norm() / ref.norm())
    assert rel < FORMAT_ERROR_BOUND[fmt], rel
    if fmt != "bf16":
        assert rel > 1e-3, "a quantised format cannot be this close to exact bf16 math: wrong cache read?"


def test_default_format_is_fp8(monkeypatch):
    monkeypatch.delenv("MLA_DECODE_FORMAT", raising=False)
    from mla_decode.competition import preferred_format
    assert preferred_format() == "fp8"  # the fastest native path on the H200 (docs/performance.md)
    monkeypatch.setenv("MLA_DECODE_FORMAT", "nope")
    with pytest.raises(ValueError, match="MLA_DECODE_FORMAT"):
        preferred_format()


def test_fallback_warns_once_then_reference(monkeypatch):
    """A missing format entry falls back to native bf16, visibly, once."""
    monkeypatch.setenv("MLA_DECODE_FORMAT", "fp8")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    fallback.reset()
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=3, device="cpu")
    data = (q, {"bf16": kv_data["bf16"]}, qo, kvp, config)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out1 = mla_decode.custom_kernel(data)
        out2 = mla_decode.custom_kernel(data)
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "falling back from native fp8" in msgs[0] and "no 'fp8' entry" in msgs[0]
    assert torch.equal(out1, out2)
    rel = float((out1.double() - exact_bf16(data)).norm() / exact_bf16(data).norm())
    assert rel < 8e-3


def test_strict_mode_raises_instead_of_falling_back(monkeypatch):
    monkeypatch.setenv("MLA_DECODE_FORMAT", "mxfp4")
    monkeypatch.setenv("MLA_DECODE_STRICT", "1")
    fallback.reset()
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=4, device="cpu")
    with pytest.raises(fallback.FallbackError, match="no 'mxfp4' entry"):
        mla_decode.custom_kernel((q, {"bf16": kv_data["bf16"]}, qo, kvp, config))


def test_operator_error_falls_back_to_bf16_with_reason(monkeypatch):
    monkeypatch.setenv("MLA_DECODE_FORMAT", "fp8")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    fallback.reset()
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=5, device="cpu")
    kv_fp8, scale = kv_data["fp8"]
    bad = dict(kv_data, fp8=(kv_fp8, scale.double()))  # wrong scale dtype: the operator raises
    with pytest.warns(RuntimeWarning, match="fp8 kv_scale must be float32"):
        out = mla_decode.custom_kernel((q, bad, qo, kvp, config))
    assert out.shape == (2, 16, 512)
