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


def test_bad_data_raises_instead_of_falling_back(monkeypatch):
    """A malformed entry is bad data, not a platform limit: a RuntimeError naming the operator's argument
    and the part of data it stands for, no warning, no float64 reference run."""
    monkeypatch.setenv("MLA_DECODE_FORMAT", "fp8")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    fallback.reset()
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=5, device="cpu")
    kv_fp8, scale = kv_data["fp8"]
    bad = dict(kv_data, fp8=(kv_fp8, scale.double()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any fallback warning fails the test
        with pytest.raises(RuntimeError, match=r"native fp8 call refused data .*kv_scale = kv_data\['fp8'\]\[1\].*"
                                               r"fp8 kv_scale must be float32, but it is Double"):
            mla_decode.custom_kernel((q, bad, qo, kvp, config))


def _no_reference(monkeypatch):
    """Makes a run of the float64 reference fail the test."""
    import mla_decode.reference as reference

    def refuse(*args, **kwargs):
        raise AssertionError("the float64 reference ran")
    monkeypatch.setattr(reference, "reference_custom_kernel", refuse)


@pytest.mark.parametrize("name,mutate,error,message", [
    ("index past the cache", lambda d: d[3].__setitem__(-1, 50383), RuntimeError,
     r"kv_indptr = data\[3\].*kv_indptr\[-1\] = 50383 exceeds the kv_cache's 128 rows"),
    ("no sm_scale", lambda d: d[4].pop("sm_scale"), ValueError, r"config has no 'sm_scale'"),
    ("sm_scale not a number", lambda d: d[4].__setitem__("sm_scale", "big"), ValueError,
     r"config\['sm_scale'\] must be a number, but it is 'big'"),
    ("fp8 entry of three", lambda d: d[1].__setitem__("fp8", d[1]["fp8"] + (None,)), ValueError,
     r"kv_data\['fp8'\] must be a \(cache, scale\) pair, but it is a tuple of 3 items"),
    ("no known format", lambda d: d[1].clear() or d[1].__setitem__("fp16", None), ValueError,
     r"kv_data must hold at least one of \['mxfp4', 'fp8', 'bf16'\], but its keys are \['fp16'\]"),
    ("kv_data not a dict", lambda d: d.__setitem__(1, [d[1]["bf16"]]), ValueError,
     r"kv_data \(data\[1\]\) must be a dict of cache formats, but it is a list"),
    ("q float32", lambda d: d.__setitem__(0, d[0].float()), RuntimeError, r"q must be bfloat16, but it is Float"),
])
def test_malformed_data_is_a_clear_error(monkeypatch, name, mutate, error, message):
    monkeypatch.setenv("MLA_DECODE_FORMAT", "fp8")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    fallback.reset()
    _no_reference(monkeypatch)
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=6, device="cpu")
    data = [q, dict(kv_data), qo, kvp.clone(), dict(config)]
    mutate(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error, match=message):
            mla_decode.custom_kernel(tuple(data))


def test_data_of_the_wrong_length_is_a_clear_error():
    with pytest.raises(ValueError, match=r"data must be \(q, kv_data, qo_indptr, kv_indptr, config\), but it is a "
                                         r"tuple of 4 items"):
        mla_decode.custom_kernel((1, 2, 3, 4))


def test_only_the_formats_kv_data_holds_are_tried(monkeypatch):
    """kv_data with only "mxfp4" and the fp8 default: one warning (no 'fp8' entry), then native MXFP4."""
    monkeypatch.setenv("MLA_DECODE_FORMAT", "fp8")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    fallback.reset()
    _no_reference(monkeypatch)
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=8, device="cpu")
    data = (q, {"mxfp4": kv_data["mxfp4"]}, qo, kvp, config)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = mla_decode.custom_kernel(data)
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "no 'fp8' entry" in msgs[0], msgs
    rel = float((out.double() - exact_bf16((q, kv_data, qo, kvp, config))).norm() /
                exact_bf16((q, kv_data, qo, kvp, config)).norm())
    assert rel < FORMAT_ERROR_BOUND["mxfp4"]


def test_no_kernel_for_the_format_falls_back_to_the_next_held_format(monkeypatch):
    """The operator's NotImplementedError (no kernel for this device or format) is a platform reason:
    reported once per distinct message, then the next format kv_data holds runs natively."""
    import mla_decode.competition as competition
    monkeypatch.setenv("MLA_DECODE_FORMAT", "fp8")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    fallback.reset()
    _no_reference(monkeypatch)
    real = competition._DECODE
    calls = []

    def no_fp8_kernel(q, kv, scale, *rest):
        calls.append(kv.dtype)
        if kv.dtype == torch.float8_e4m3fn:
            raise NotImplementedError(f"no fp8 kernel for {q.shape[0]} rows")
        return real(q, kv, scale, *rest)
    monkeypatch.setattr(competition, "_DECODE", no_fp8_kernel)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for batch in (2, 2, 3):  # two distinct messages: two warnings
            data = generate_input(batch, 1, 64, seed=batch, device="cpu")
            out = mla_decode.custom_kernel(data)
            assert out.shape == (batch, 16, 512)
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 2 and all("no fp8 kernel" in m for m in msgs), msgs
    assert calls == [torch.float8_e4m3fn, torch.bfloat16] * 3


def test_no_native_library_falls_back_to_the_reference_once(monkeypatch):
    from mla_decode import _ops
    monkeypatch.setenv("MLA_DECODE_FORMAT", "mxfp4")
    monkeypatch.delenv("MLA_DECODE_STRICT", raising=False)
    monkeypatch.setattr(_ops, "LOAD_ERROR", "the native library is missing (test)")
    fallback.reset()
    q, kv_data, qo, kvp, config = generate_input(2, 1, 64, seed=9, device="cpu")
    data = (q, {"mxfp4": kv_data["mxfp4"]}, qo, kvp, config)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = mla_decode.custom_kernel(data)
        mla_decode.custom_kernel(data)
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "native library is missing" in msgs[0], msgs
    rel = float((out.double() - exact_bf16((q, kv_data, qo, kvp, config))).norm() /
                exact_bf16((q, kv_data, qo, kvp, config)).norm())
    assert rel < FORMAT_ERROR_BOUND["mxfp4"]
    # Bad data on the reference path is as clear as on the native one.
    bad = (q, {"mxfp4": kv_data["mxfp4"]}, qo, kvp.clone().index_fill_(0, torch.tensor([2]), 50383), config)
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\] = 50383 exceeds the cache's rows \(128\)"):
        mla_decode.custom_kernel(bad)


def test_fallback_reports_each_distinct_message_once():
    fallback.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fallback.report("native fp8", "no kernel", NotImplementedError("sm_75"))
        fallback.report("native fp8", "no kernel", NotImplementedError("sm_75"))
        fallback.report("native fp8", "no kernel", NotImplementedError("sm_61"))
    assert len(rec) == 2


def test_docstring_quotes_no_measurements():
    """Figures live in docs/performance.md only."""
    import re

    import mla_decode.competition as competition
    assert not re.search(r"\d+(\.\d+)? ?us\b|\d\.\d+e-\d", competition.__doc__), competition.__doc__
