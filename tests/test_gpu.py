"""GPU-only coverage: the head-count / q_len / layout matrix, forced split counts, long
sequences, NaN rules and the competition entry. Every case runs on every split kernel that can
run it on this GPU (cases.kernel_variants: the plan's choice, each other applicable kernel
forced in-process through the plan overrides, and the mma.sync kernel planned as on a 99 KB
device), so each Hopper kernel sees the whole matrix, not only the shapes the plan sends it."""

import pytest
import torch

import mla_decode
from mla_decode.reference import dequantize_cache, reference_decode
from cases import (FORMATS, LAYOUTS, SM_SCALE, SMEM_99KB, check_against_reference, check_every_kernel,
                   explain_case, kernel_variants, make_case, run_case)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]
DEV = torch.device("cuda")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_heads", [16, 32, 64, 128])
@pytest.mark.parametrize("q_len", [1, 2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matrix(fmt, num_heads, q_len, layout):
    lengths = [513, 0, 31, 1, 96]
    case = make_case(fmt, layout, num_heads, q_len, lengths, seed=num_heads * 7 + q_len, device=DEV)
    check_every_kernel(case)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_heads", [16, 128])
def test_large_logits(fmt, num_heads):
    """Queries scaled by 4 (logits of standard deviation 4, largest ~20): the score error of a
    kernel is relative to the scores' magnitude (the e4m3 QK's tensor-core accumulation above
    all), and the LSE tolerance is absolute. The running maxima move often, so the lazy
    rescaling of O and of the row sums is exercised on every kernel (H = 128: the wide ones)."""
    case = make_case(fmt, "indptr", num_heads, 1, [4100, 64, 1], seed=11, device=DEV, q_scale=4.0)
    check_every_kernel(case)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 12, 16, 64])  # 12, 16: the combine's 9-16 split variant
def test_forced_splits(fmt, num_splits):
    case = make_case(fmt, "indptr", 16, 1, [1000, 5, 0, 64], seed=num_splits, device=DEV)
    check_every_kernel(case, num_splits)


@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_splits_two_combine_chunks(fmt):
    """38 non-empty splits of 32 keys: the combine folds them in two chunks (32 + 6), so a
    row whose largest split LSE is in the second chunk needs the running rescale."""
    case = make_case(fmt, "indptr", 16, 1, [1200, 5, 0, 260], seed=40, device=DEV)
    check_every_kernel(case, 40)


@pytest.mark.parametrize("fmt", FORMATS)
def test_alternating_split_counts_and_shapes(fmt):
    """Back-to-back calls on one stream with different split counts, head counts and
    q_len: no state (workspace, partials) may leak from one call into the next."""
    cases = [make_case(fmt, "indptr", 16, 1, [700, 5, 0, 64], seed=51, device=DEV),
             make_case(fmt, "indptr", 32, 2, [300, 90], seed=52, device=DEV)]
    for ov in kernel_variants(cases[0]):
        for num_splits in [3, 8, 2, 3, 5]:
            for case in cases:
                check_against_reference(case, *run_case(case, num_splits, ov))


@pytest.mark.parametrize("fmt", FORMATS)
def test_concurrent_calls_on_two_streams(fmt):
    """Split calls interleaved on two streams (each with its own workspace) stay exact."""
    case = make_case(fmt, "indptr", 16, 1, [900, 33, 0, 257], seed=53, device=DEV)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(4):
        for s in streams:
            with torch.cuda.stream(s):
                results.append(torch.ops.mla_decode.decode(*case.args(), 4))
    torch.cuda.synchronize()
    for out, lse in results:
        check_against_reference(case, out, lse)


@pytest.mark.parametrize("fmt", FORMATS)
def test_split_calls_with_growing_rows_and_graph_replays_in_between(fmt):
    """Split calls of different inputs, row counts (300 tokens x 16 heads, then 4 x 16) and split
    counts, enqueued back to back on one stream with a CUDA-graph replay of another split call
    between them, checked only at the end: no state of one call (workspace, partials, anything a
    combine hand-off might keep, such as the per-row tickets of a combine that was tried and not
    kept) may leak into the next, or let a combine read partials before they are written."""
    big = make_case(fmt, "indptr", 16, 1, [40 + (i % 7) for i in range(300)], seed=54, device=DEV)
    small = make_case(fmt, "indptr", 16, 1, [700, 5, 0, 64], seed=55, device=DEV)
    static = make_case(fmt, "indptr", 16, 1, [600, 90], seed=56, device=DEV)
    graph = torch.cuda.CUDAGraph()
    torch.ops.mla_decode.decode(*static.args(), 4)  # warm-up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        g_out, g_lse = torch.ops.mla_decode.decode(*static.args(), 4)
    results = []  # everything is enqueued back to back on the stream, checked at the end
    for num_splits in [3, 4, 2]:
        for case in [small, big, small]:
            results.append((case, *torch.ops.mla_decode.decode(*case.args(), num_splits)))
        graph.replay()
        results.append((static, g_out.clone(), g_lse.clone()))
    torch.cuda.synchronize()
    for case, out, lse in results:
        check_against_reference(case, out, lse)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_long_sequence(fmt):
    """9000 keys in one item: long split loops (the narrow kernels' lazy rescaling over ~140
    tiles), paged and (for the TMA forms) indptr."""
    case = make_case(fmt, "paged", 16, 1, [9000, 3], seed=77, device=DEV, page_size=64)
    check_every_kernel(case)
    case = make_case(fmt, "indptr", 16, 1, [9000, 3], seed=78, device=DEV)
    check_every_kernel(case)


@pytest.mark.parametrize("num_heads", [3, 17, 100])
def test_odd_head_counts(num_heads):
    for fmt in ("fp8", "bf16", "mxfp4"):
        case = make_case(fmt, "indptr", num_heads, 2, [77, 0, 140], seed=num_heads, device=DEV)
        check_every_kernel(case)


def test_fp8_subnormal_codes_are_not_flushed():
    """Codes with a zero exponent field decode to m/8 * 2^-6; a flush would zero them."""
    case = make_case("fp8", "indptr", 16, 1, [64], seed=5, device=DEV)
    codes = torch.randint(1, 8, case.kv.shape, device=DEV, dtype=torch.uint8)  # e = 0, m = 1..7
    codes |= torch.randint(0, 2, case.kv.shape, device=DEV, dtype=torch.uint8) << 7
    case.kv.view(torch.uint8).copy_(codes)
    from mla_decode.reference import dequantize_cache, reference_decode
    case.ref_out, case.ref_lse = reference_decode(case.q.cpu(), dequantize_cache(case.kv.cpu(), case.kv_scale.cpu()),
                                                  case.qo_indptr.cpu(), 1 / 24, kv_indptr=case.kv_indptr.cpu())
    check_every_kernel(case)


def test_mxfp4_block_scales_across_the_range():
    """MXFP4 block scales E in [0, 5), [122, 129) and [129, 131), by groups of 64 rows (a tile):
    the kernels that multiply by 2^(E-1) once when it is a normal bf16 (E <= 128) and by two
    factors otherwise must both decode exactly, as must the tiny products of E near 0. (The
    scales stay moderate: at E ~ 140 the scores reach ~1e4 and fp32 rounding of the score alone
    exceeds the absolute LSE tolerance.)"""
    case = make_case("mxfp4", "indptr", 16, 1, [700, 300], seed=21, device=DEV)
    gen = torch.Generator().manual_seed(3)
    rows = case.kv_scale.shape[0]
    group = (torch.arange(rows) // 64) % 3
    low = torch.tensor([0, 122, 129])[group]
    width = torch.tensor([5, 7, 2])[group]
    exps = low[:, None] + (torch.rand(rows, case.kv_scale.shape[1], generator=gen) * width[:, None]).long()
    used = slice(5, 5 + 1000)  # make_case's indptr layout: the items' rows
    scale = case.kv_scale.cpu()
    scale[used] = exps[used].to(scale.dtype)
    case.kv_scale = scale.to(DEV)
    from mla_decode.reference import dequantize_cache, reference_decode
    case.ref_out, case.ref_lse = reference_decode(case.q.cpu(), dequantize_cache(case.kv.cpu(), scale),
                                                  case.qo_indptr.cpu(), SM_SCALE, kv_indptr=case.kv_indptr.cpu())
    for num_splits in (0, 1, 3):
        check_every_kernel(case, num_splits)


def test_bad_index_gives_nan_not_a_crash():
    case = make_case("bf16", "indices", 16, 1, [50, 20], seed=8, device=DEV)
    case.kv_indices[3] = 10**9  # outside the cache
    for ov in kernel_variants(case):
        out, lse = run_case(case, 0, ov)
        torch.cuda.synchronize()
        assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all(), ov
        assert torch.isfinite(out[1]).all(), ov


@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_lone_bad_index_is_nan(num_splits):
    """A row whose only visible key has a bad index must be NaN, not 0 / -inf."""
    case = make_case("fp8", "indices", 16, 1, [1, 40], seed=12, device=DEV)
    case.kv_indices[0] = -5
    for ov in kernel_variants(case):
        out, lse = run_case(case, num_splits, ov)
        torch.cuda.synchronize()
        assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all(), ov
        assert torch.isfinite(out[1]).all(), ov


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8", "bf16"])
def test_custom_kernel_on_competition_inputs(fmt, monkeypatch):
    from mla_decode.inputs import generate_input
    from mla_decode.reference import dequantize_cache, reference_decode
    monkeypatch.setenv("MLA_DECODE_FORMAT", fmt)
    monkeypatch.setenv("MLA_DECODE_STRICT", "1")
    for batch, kv in [(4, 1024), (32, 1024)]:
        data = generate_input(batch, 1, kv, seed=batch + kv, device="cuda")
        q, kv_data, qo, kvp, config = data
        out = mla_decode.custom_kernel(data)
        assert out.shape == (batch, 16, 512) and out.dtype == torch.bfloat16
        cache, scale = (kv_data[fmt], None) if fmt == "bf16" else kv_data[fmt]
        ref, _ = reference_decode(q.cpu(), dequantize_cache(cache.cpu(), None if scale is None else scale.cpu()),
                                  qo.cpu(), config["sm_scale"], kv_indptr=kvp.cpu())
        rel = float((out.cpu().double() - ref).norm() / ref.norm())
        assert rel < 8e-3, rel


def _hopper_kernel_built():
    import re
    from mla_decode import _build_info
    archs = re.split(r"[;\s,]+", (_build_info.CUDA_ARCHS or "").strip())
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and "9.0a" in archs


# The Hopper wide kernel's edges (64 heads per CTA on wgmma; H >= 64): head groups with unused
# rows (H = 100), forced split counts including empty splits, keys past one 64-key tile and bad
# indices. Most are below its size threshold; check_every_kernel forces it.
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("num_heads", [64, 100, 128])
@pytest.mark.parametrize("num_splits", [0, 1, 3, 64])
def test_wide_heads(fmt, num_heads, num_splits):
    case = make_case(fmt, "indptr", num_heads, 1, [1000, 5, 0, 64, 129], seed=num_heads + num_splits, device=DEV)
    check_every_kernel(case, num_splits)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("layout", ["indptr", "indices", "paged"])  # bf16 indptr: the wide kernel's TMA form
def test_wide_heads_long_and_causal(fmt, layout):
    case = make_case(fmt, layout, 128, 3, [4100, 70], seed=91, device=DEV, page_size=64)
    check_every_kernel(case)


# Output rows as views: padded strides (16-byte aligned rows) and an 8-byte offset (rows not 16-byte
# aligned: the wide kernel's epilogue then stores 4 bytes at a time instead of staging 16-byte
# chunks through shared memory), each on every kernel, one split and several.
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("view", ["padded", "offset"])
def test_out_views_on_every_kernel(fmt, view):
    case = make_case(fmt, "indptr", 128, 1, [300, 64, 0, 1], seed=17, device=DEV)
    rows, heads = case.q.shape[0], case.q.shape[1]
    for ov in kernel_variants(case):
        for num_splits in [1, 3]:
            if view == "padded":
                buf = torch.full((rows, heads, 520), float("nan"), dtype=torch.bfloat16, device=DEV)
                out = buf[:, :, :512]
            else:
                buf = torch.full((rows * heads * 512 + 4,), float("nan"), dtype=torch.bfloat16, device=DEV)
                out = buf[4:].view(rows, heads, 512)
            lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=DEV)
            if ov is None:
                torch.ops.mla_decode.decode_out(*case.args(), num_splits, out, lse)
            else:
                from mla_decode.api import _overrides_text
                torch.ops.mla_decode._decode_out_with(*case.args(), num_splits, out, lse, _overrides_text(ov))
            try:
                check_against_reference(case, out, lse)
            except AssertionError as e:
                raise AssertionError(f"{ov or 'the plan'}, {num_splits} splits: {e}") from e
            if view == "padded":
                assert torch.isnan(buf[:, :, 512:]).all(), "the padding between rows was written"
            else:
                assert torch.isnan(buf[:4]).all(), "the elements before the output were written"


# The query as a view: padded heads (head stride 640, NaN in the gap), head-major (a transposed
# (H, T, 576) tensor) and one token's Q repeated across tokens (an expanded view, token stride 0), on
# every kernel, one split and several. The wide kernel's TMA form lands Q through a tensor map over
# these strides; the expanded view, which no tensor map describes, takes its cp.async form.
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("view", ["padded", "head_major", "expanded"])
def test_query_views_on_every_kernel(fmt, view):
    case = make_case(fmt, "indptr", 128, 1, [300, 64, 0, 129], seed=23, device=DEV)
    rows, heads = case.q.shape[0], case.q.shape[1]
    if view == "padded":
        buf = torch.full((rows, heads, 640), float("nan"), dtype=torch.bfloat16, device=DEV)
        buf[:, :, :576] = case.q
        case.q = buf[:, :, :576]
    elif view == "head_major":
        case.q = case.q.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        case.q = case.q[:1].expand(rows, heads, 576)
        kv_rows = dequantize_cache(case.kv.cpu(), None if case.kv_scale is None else case.kv_scale.cpu())
        case.ref_out, case.ref_lse = reference_decode(case.q.cpu(), kv_rows, case.qo_indptr.cpu(), SM_SCALE,
                                                      kv_indptr=case.kv_indptr.cpu())
    plan = explain_case(case, overrides={"kernel": "wide"})
    assert plan.tma_tiles == (fmt == "bf16" and view != "expanded"), plan
    for num_splits in (0, 3):
        ran = check_every_kernel(case, num_splits)
        assert explain_case(case).kernel == "wide" or {"kernel": "wide"} in ran, ran


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_out_rows_not_8_byte_aligned_are_a_clear_error(offset):
    case = make_case("bf16", "indptr", 16, 1, [40, 3], seed=5, device=DEV)
    rows, heads = case.q.shape[0], case.q.shape[1]
    buf = torch.empty((rows * heads * 512 + 4,), dtype=torch.bfloat16, device=DEV)
    lse = torch.empty((rows, heads), dtype=torch.float32, device=DEV)
    with pytest.raises(RuntimeError, match=rf"out's rows must start at 8-byte aligned addresses.*{2 * offset} bytes past"):
        torch.ops.mla_decode.decode_out(*case.args(), 0, buf[offset:offset + rows * heads * 512].view(rows, heads, 512), lse)
    torch.cuda.synchronize()  # nothing was launched: the context is still usable


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_wide_heads_bad_index_gives_nan(fmt):
    case = make_case(fmt, "indices", 128, 1, [150, 20], seed=9, device=DEV)
    case.kv_indices[70] = 10**9  # outside the cache, in the second 64-key tile
    for ov in kernel_variants(case):
        for num_splits in [0, 1, 2]:
            out, lse = run_case(case, num_splits, ov)
            torch.cuda.synchronize()
            assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all(), ov
            assert torch.isfinite(out[1]).all() and torch.isfinite(lse[1]).all(), ov


@pytest.mark.skipif(not _hopper_kernel_built(), reason="needs an H100/H200 and a build with TORCH_CUDA_ARCH_LIST 9.0a")
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("cache_size", ["small", "above_3x_l2"])
def test_tma_forms_with_and_without_the_l2_stream_hint(fmt, cache_size):
    """The plan puts these calls on the TMA-landed narrow forms (bf16; fp8's register-V kernel)
    and gives their tile loads the L2 evict_first policy when the cache is at most 3x L2
    (tests/test_plan.py checks the plan's threshold): ragged items
    totalling 32768 (bf16) / 65536 (fp8) keys take it, two items whose cache is just above 3x
    L2 do not. Both forms must give the reference's result."""
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    row_bytes = 1152 if fmt == "bf16" else 576
    if cache_size == "small":
        lengths = [8192, 7999, 8300, 8277] * (1 if fmt == "bf16" else 2)
        assert sum(lengths) * row_bytes <= 3 * l2
    else:
        n = 3 * l2 // row_bytes // 2 + 512
        lengths = [n, n - 333]
        assert sum(lengths) * row_bytes > 3 * l2
    case = make_case(fmt, "indptr", 16, 1, lengths, seed=17, device=DEV)
    plan = explain_case(case)
    assert plan.kernel == ("narrow" if fmt == "bf16" else "narrow_register_v"), str(plan)
    assert plan.stream_kv == (cache_size == "small"), str(plan)
    check_every_kernel(case)


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("pattern", ["every_row", "runs"])
@pytest.mark.parametrize("scale_row_stride", [18, 32])
def test_mxfp4_block_scales_on_every_kernel(heads, pattern, scale_row_stride):
    """MXFP4 block scales across their range, on every kernel that can run the call: the Hopper
    kernels decode with one bf16 factor 2^(E - 1) while E <= 128 (a normal bf16) and with two
    otherwise. Rows times 2^24 (E ~ 150) with queries times 2^-24 (the logits stay those of
    unscaled data), or runs of 100 rows times 2^4 (E ~ 130) with queries times 2^-4 (tiles of
    small blocks only, of large ones only, and mixed); the block scales as a tensor of 18- or
    32-byte rows (the padding NaN scales)."""
    exp, period = (24, 0) if pattern == "every_row" else (4, 100)
    case = make_case("mxfp4", "indptr", heads, 1, [1000, 777, 300, 1], seed=23, device=DEV, q_scale=2.0 ** -exp,
                     row_pow2=(exp, period), scale_row_stride=scale_row_stride)
    assert case.kv_scale.stride() == (scale_row_stride, 1)
    e = case.kv_scale.view(torch.uint8)[5:5 + 2078].int()
    assert (e > 128).any() and (pattern == "every_row" or (e[:64] <= 128).all())
    for num_splits in (0, 1, 3):
        check_every_kernel(case, num_splits)


def _nvidia_gpu():
    return torch.cuda.is_available() and torch.version.hip is None


@pytest.mark.skipif(not _hopper_kernel_built(), reason="needs an H100/H200 and a build with TORCH_CUDA_ARCH_LIST 9.0a")
def test_every_hopper_kernel_is_among_the_variants():
    """On a Hopper build the forced variants reach every kernel: the wide kernel for H >= 64,
    the narrow kernel for H < 64, the register-V kernel for OCP fp8 of the indptr layout, and
    the mma.sync kernel with both ring sets everywhere."""
    def kernels(fmt, heads, layout):
        case = make_case(fmt, layout, heads, 1, [70, 3], seed=1, device=DEV)
        planned = explain_case(case).kernel  # the variant None runs the plan's own choice
        return {(planned, None) if v is None else (v["kernel"], v.get("smem_limit")) for v in kernel_variants(case)}
    assert {("wide", None), ("mma_sync", None), ("mma_sync", SMEM_99KB)} <= kernels("bf16", 128, "indptr")
    assert {("narrow", None), ("narrow_register_v", None)} <= kernels("fp8", 16, "indptr")
    assert ("narrow_register_v", None) not in kernels("fp8", 16, "paged")
    assert ("narrow", None) in kernels("bf16", 16, "indptr") and ("narrow", None) not in kernels("bf16", 16, "paged")
    assert ("narrow", None) in kernels("mxfp4", 32, "indices")


@pytest.mark.skipif(not _nvidia_gpu(), reason="the mma.sync kernel's ring depths are NVIDIA-only")
def test_too_little_shared_memory_is_a_clear_error():
    """With 64 KB per block no built ring fits any format: each call raises a RuntimeError
    naming the bytes needed and the limit, instead of a bare launch failure."""
    for fmt in FORMATS:
        case = make_case(fmt, "indptr", 16, 1, [40, 7], seed=3, device=DEV)
        with pytest.raises(RuntimeError, match=r"bytes of shared memory per block.*allows 65536 \(the smem_limit"):
            run_case(case, 0, {"kernel": "mma_sync", "smem_limit": 65536})


def test_forced_kernel_that_cannot_run_the_call_is_a_clear_error():
    case = make_case("bf16", "indptr", 16, 1, [40, 7], seed=3, device=DEV)
    with pytest.raises(RuntimeError, match=r"force the wide kernel, which cannot run this call.*H >= 64"):
        run_case(case, 0, {"kernel": "wide"})
