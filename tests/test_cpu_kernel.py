"""The CPU kernel on every path (scalar, AVX2, AVX-512 BF16, AMX, and the automatic choice),
each forced through the private operator's cpu_path override, against the float64 reference
of tests/cases.py with its tolerances: every format and layout, ragged lengths including 0,
q_len 1-4, H 1 / 16 / 17 / 128, NaN in every unused cache row, NaN-poisoned outputs. A path
this CPU cannot run is skipped with the operator's own reason (e.g. "the CPU lacks AMX-BF16").
"""

import warnings
import zlib

import pytest
import torch

import mla_decode
from cases import FORMATS, LAYOUTS, SM_SCALE, check_against_reference, explain_case, make_case, run_case

PATHS = ("scalar", "avx2", "avx512", "avx512_fp32", "amx", "auto")
FORCED = PATHS[:-1]
CPU = torch.device("cpu")


def _tiny():
    q = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    kv = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    ind = torch.tensor([0, 1], dtype=torch.int32)
    return q, kv, ind


def path_unavailable(path):
    q, kv, ind = _tiny()
    return mla_decode.explain(q, kv, ind, kv_indptr=ind, overrides={"cpu_path": path}).error


def require(path):
    why = path_unavailable(path)
    if why:
        pytest.skip(f"cpu_path={path}: {why}")


def run_path(case, path):
    return run_case(case, overrides={"cpu_path": path})


_cases = {}


def cached_case(*args, **kw):
    key = repr((args, sorted(kw.items())))
    if key not in _cases:
        _cases[key] = make_case(*args, device=CPU, **kw)
    return _cases[key]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("num_heads,q_len", [(1, 1), (1, 4), (16, 1), (16, 2), (17, 3), (128, 1), (128, 4)])
def test_path_matches_reference(path, fmt, layout, num_heads, q_len):
    require(path)
    lengths = [37, 0, 5, 64, 130] if num_heads < 128 else [37, 0, 70]
    case = cached_case(fmt, layout, num_heads, q_len, lengths, seed=zlib.crc32(repr((fmt, layout, num_heads, q_len)).encode()) % 997)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)
    assert explain_case(case, overrides={"cpu_path": path}).kernel.startswith("cpu_")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_heads,q_len", [(48, 1), (80, 1), (96, 2), (64, 2), (32, 3)])
def test_group_blocks(path, fmt, num_heads, q_len):
    """Head counts whose groups the AMX path scores and multiplies in blocks of 4, 2 and 1
    (3, 5, 6 groups per token), and query tokens whose blocks see different key counts in the
    last tiles (q_len 2 and 3: the blocks of one token share their PV, the next token's do not),
    at lengths on both sides of the 64-key QK blocks and 128-key tiles."""
    require(path)
    lengths = [1, 63, 65, 129, 200, 258]
    case = cached_case(fmt, "indptr", num_heads, q_len, lengths,
                       seed=zlib.crc32(repr(("blocks", fmt, num_heads, q_len)).encode()) % 997)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_tile_edges_and_causal_tails(path, fmt):
    """Lengths on both sides of the 16 / 32 / 64-key tiles, 3 query tokens whose visible counts
    end inside a tile."""
    require(path)
    lengths = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]
    case = cached_case(fmt, "indptr", 16, 3, lengths, seed=5)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["indptr", "paged"])
def test_long_keys_are_split_and_merged(path, fmt, layout):
    """Few rows with thousands of keys: the keys are cut into pieces run on all threads and
    merged by log-sum-exp (explain reports the split)."""
    require(path)
    case = cached_case(fmt, layout, 16, 2, [2600, 0, 1100, 1025], seed=21)
    plan = explain_case(case, overrides={"cpu_path": path})
    assert int(plan.splits) > 1, plan
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
def test_h128_long_keys(path):
    require(path)
    if path == "scalar":
        lengths = [700, 0]
    else:
        lengths = [3000, 0, 200]
    case = cached_case("mxfp4", "indices", 128, 1, lengths, seed=8)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_large_logits(path, fmt):
    """Logits of standard deviation 8: exercises the lazy rescale of the vector paths (the
    running max moves by more than 2^8 between tiles)."""
    require(path)
    case = cached_case(fmt, "indptr", 16, 1, [600, 64, 1, 200], seed=11, q_scale=8.0)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
def test_results_do_not_depend_on_threads(path):
    require(path)
    case = cached_case("fp8", "indptr", 16, 2, [3000, 0, 900, 50], seed=4)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out1, lse1 = run_path(case, path)
        torch.set_num_threads(2)
        out2, lse2 = run_path(case, path)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(out1, out2)
    assert torch.equal(lse1, lse2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_len,nan_key", [(20, 3), (2600, 1700)])
def test_nan_in_used_row_propagates(path, kv_len, nan_key):
    require(path)
    case = make_case("bf16", "indptr", 16, 1, [kv_len], seed=9, device=CPU)
    start = int(case.kv_indptr[0])
    case.kv[start + nan_key, 0, 7] = float("nan")
    out, lse = run_path(case, path)
    assert torch.isnan(out).all()
    assert torch.isnan(lse).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_nan_key_seen_only_by_a_later_token(path, fmt):
    """q_len 3, NaN in the last key: only the last query token sees it. The earlier tokens share
    the key's tile but must stay exact (their probability 0 may not meet the NaN value)."""
    require(path)
    case = make_case(fmt, "indptr", 16, 3, [100, 70], seed=13, device=CPU)
    row = int(case.kv_indptr[1]) - 1  # key 99 of item 0: visible to its token 2 only
    if fmt == "bf16":
        case.kv[row, 0, 5] = float("nan")
    elif fmt == "fp8":
        case.kv.view(torch.uint8)[row, 0, 5] = 0x7F
    else:
        case.kv_scale.view(torch.uint8)[row, 0] = 0xFF
    out, lse = run_path(case, path)
    assert torch.isnan(out[2]).all() and torch.isnan(lse[2]).all()
    keep = [0, 1, 3, 4, 5]
    ref_out, ref_lse = case.ref_out[keep], case.ref_lse[keep]
    rel = float((out[keep].double() - ref_out).norm() / ref_out.norm())
    assert rel < 8e-3, rel
    assert float((lse[keep].double() - ref_lse).abs().max()) < 2e-3


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fnuz", [False, True])
def test_every_fp8_code(path, fnuz):
    """A cache holding every finite fp8 code (normal, subnormal, both zeros), against the
    reference's decode."""
    require(path)
    fmt = "fp8_fnuz" if fnuz else "fp8"
    case = make_case(fmt, "indptr", 16, 1, [40, 9], seed=17, device=CPU)
    codes = torch.arange(40 * 576 + 9 * 576, dtype=torch.int64) % 256
    nan_codes = (codes == 0x80) if fnuz else ((codes & 0x7F) == 0x7F)
    codes[nan_codes] = 0x01  # the smallest subnormal instead
    start = int(case.kv_indptr[0])
    case.kv.view(torch.uint8)[start:start + 49, 0] = codes.to(torch.uint8).reshape(49, 576)
    from mla_decode.reference import dequantize_cache, reference_decode
    case.ref_out, case.ref_lse = reference_decode(case.q, dequantize_cache(case.kv, case.kv_scale), case.qo_indptr,
                                                  SM_SCALE, kv_indptr=case.kv_indptr)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
def test_mxfp4_scales_far_from_one_and_outside_the_exponent_add(path):
    """Block exponents from 110 to 134 (as test_decode), plus blocks with E8M0 bytes 1 and 253
    (outside the range where the vector paths add the scale to the bf16 exponent, decoded by
    the fp32 product instead), and a padded scale tensor read through its strides (row stride 24)."""
    require(path)
    from mla_decode.reference import dequantize_cache, reference_decode
    case = make_case("mxfp4", "indptr", 16, 2, [150, 0, 70], seed=71, device=CPU)
    start, end = int(case.kv_indptr[0]), int(case.kv_indptr[-1])
    gen = torch.Generator().manual_seed(71)
    low = torch.where(torch.arange(end - start) % 2 == 0, 110, 118)
    exps = low[:, None] + torch.randint(0, 17, (end - start, 18), generator=gen)
    exps[::7, 3] = 1      # tiny blocks next to normal ones
    exps[5::11, 16] = 253  # huge rope blocks with zero codes only (finite logits)
    padded = torch.full((case.kv_scale.shape[0], 24), 0xFF, dtype=torch.uint8)
    padded[:, :18] = case.kv_scale.view(torch.uint8)
    padded[start:end, :18] = exps.to(torch.uint8)
    case.kv.view(torch.uint8)[start + 5:end:11, 0, 16 * 16:17 * 16] = 0  # codes of those blocks: +0
    case.kv_scale = padded[:, :18]
    assert case.kv_scale.stride() == (24, 1)
    case.ref_out, case.ref_lse = reference_decode(case.q, dequantize_cache(case.kv, case.kv_scale), case.qo_indptr,
                                                  SM_SCALE, kv_indptr=case.kv_indptr)
    out, lse = run_path(case, path)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("path", PATHS)
def test_all_items_empty(path):
    require(path)
    case = make_case("mxfp4", "indptr", 16, 2, [0, 0], seed=5, device=CPU)
    out, lse = run_path(case, path)
    assert (out == 0).all()
    assert torch.isinf(lse).all() and (lse < 0).all()


def test_paths_agree_closely():
    """The vector paths compute the same bf16 products as each other (AVX-512 and AMX) or fp32
    ones (AVX2, scalar): pairwise far inside the reference tolerance."""
    case = cached_case("fp8", "paged", 16, 2, [700, 33, 0, 129], seed=31)
    outs = {p: run_path(case, p)[0].double() for p in FORCED
            if not path_unavailable(p)}
    ref = outs["scalar"]
    for p, o in outs.items():
        rel = float((o - ref).norm() / ref.norm())
        assert rel < 4e-3, (p, rel)


def test_explain_names_the_path_and_split():
    q, kv, ind = _tiny()
    plan = mla_decode.explain(q, kv, ind, kv_indptr=ind)
    assert plan.kernel in tuple(f"cpu_{p}" for p in FORCED), plan
    assert plan.why.startswith("auto: ")
    if plan.fields["parallel"] == "at-parallel-for":
        assert int(plan.fields["threads"]) == torch.get_num_threads()
    else:
        assert plan.fields["parallel"] == "serial-build" and plan.fields["threads"] == "1"
    assert "pieces" in plan.fields and int(plan.splits) >= 1
    for path in FORCED:
        forced = mla_decode.explain(q, kv, ind, kv_indptr=ind, overrides={"cpu_path": path})
        assert forced.kernel == f"cpu_{path}"
        assert forced.why == "forced by the override cpu_path"


def _intel():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return None


def test_auto_takes_the_best_path_this_cpu_has():
    q, kv, ind = _tiny()
    kernel = mla_decode.explain(q, kv, ind, kv_indptr=ind).kernel
    if not path_unavailable("amx"):
        assert kernel == "cpu_amx"
    elif not path_unavailable("avx512") and _intel() is False:
        assert kernel == "cpu_avx512"
    elif not path_unavailable("avx512_fp32"):
        assert kernel in ("cpu_avx512", "cpu_avx512_fp32") if _intel() is None else kernel == "cpu_avx512_fp32"
    elif not path_unavailable("avx2"):
        assert kernel == "cpu_avx2"
    else:
        assert kernel == "cpu_scalar"


@pytest.mark.parametrize("path", FORCED)
def test_forcing_a_path_the_cpu_lacks_raises_with_the_reason(path):
    why = path_unavailable(path)
    if not why:
        pytest.skip(f"this CPU runs cpu_path={path}")
    case = cached_case("bf16", "indptr", 16, 1, [10], seed=1)
    with pytest.raises(RuntimeError, match=f"the CPU path '{path}' cannot run on this CPU: "):
        run_path(case, path)


def test_unknown_path_name_raises():
    case = cached_case("bf16", "indptr", 16, 1, [10], seed=1)
    with pytest.raises(RuntimeError, match="cpu_path names no CPU path of this build: 'avx1024'"):
        run_path(case, "avx1024")


def test_amx_self_test_warns_only_when_it_fails():
    """Where AMX runs, the auto path's one-time self-test passed silently; where the CPU lacks
    AMX there is nothing to test and no warning either."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        case = cached_case("bf16", "indptr", 16, 1, [10], seed=1)
        run_path(case, "auto")
    amx_warnings = [x for x in w if "AMX is off" in str(x.message)]
    if path_unavailable("amx") is None:
        assert not amx_warnings
