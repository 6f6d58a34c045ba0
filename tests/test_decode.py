"""The decode operator against float64 exact math on the same dequantised cache.

Runs on the CPU everywhere and on the GPU when one is present (the `device`
fixture). Every case has random data, NaN in every cache row that no token
references, ragged lengths including 0, and poisoned output buffers.
"""

import math

import pytest
import torch

import mla_decode  # noqa: F401
from cases import FORMATS, LAYOUTS, SM_SCALE, check_against_reference, make_case

GPU = torch.cuda.is_available()


def run_op(case, num_splits=0, poisoned=True):
    out = torch.full((case.q.shape[0], case.q.shape[1], 512), float("nan"), dtype=torch.bfloat16,
                     device=case.q.device)
    lse = torch.full((case.q.shape[0], case.q.shape[1]), float("nan"), dtype=torch.float32, device=case.q.device)
    if poisoned:
        torch.ops.mla_decode.decode_out(*case.args(), num_splits, out, lse)
    else:
        out, lse = torch.ops.mla_decode.decode(*case.args(), num_splits)
    return out, lse


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("num_heads,q_len", [(1, 1), (1, 3), (16, 1), (16, 3), (128, 1), (128, 3), (5, 3)])
def test_decode_matches_reference(device, fmt, layout, num_heads, q_len):
    lengths = [37, 0, 5, 64] if device.type == "cpu" else [300, 0, 7, 129, 1]
    case = make_case(fmt, layout, num_heads, q_len, lengths, seed=hash((fmt, layout, num_heads, q_len)) % 1000,
                     device=device)
    out, lse = run_op(case)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["indptr", "paged"])
def test_long_keys_few_rows(device, fmt, layout):
    """Few query rows with thousands of keys: the CPU operator splits such rows' keys into
    chunks and merges them (decode_cpu.cpp), the GPU plans KV splits. Ragged, with an empty item."""
    case = make_case(fmt, layout, 16, 2, [2600, 0, 1100, 1025], seed=21, device=device)
    out, lse = run_op(case)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("fmt", FORMATS)
def test_large_logits(device, fmt):
    """Queries scaled by 8 (logits of standard deviation 8, LSE up to ~30): the LSE tolerance is
    absolute, so a score error relative to the logits' magnitude shows here first. (The GPU
    kernels selected by switches have their own large-logit test in test_gpu.py.)"""
    case = make_case(fmt, "indptr", 16, 1, [600, 64, 1], seed=11, device=device, q_scale=8.0)
    out, lse = run_op(case)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("fmt", FORMATS)
def test_functional_and_out_variants_agree(device, fmt):
    case = make_case(fmt, "indptr", 16, 1, [40, 3], seed=11, device=device)
    out1, lse1 = run_op(case, poisoned=True)
    out2, lse2 = run_op(case, poisoned=False)
    assert torch.equal(out1, out2)
    assert torch.equal(lse1, lse2)


def test_python_api(device):
    case = make_case("fp8", "paged", 16, 2, [33, 0, 70], seed=3, device=device)
    out, lse = mla_decode.decode(case.q, case.kv, case.qo_indptr, kv_scale=case.kv_scale,
                                 block_table=case.block_table, kv_lens=case.kv_lens, page_size=case.page_size,
                                 sm_scale=SM_SCALE, return_lse=True)
    check_against_reference(case, out, lse)
    out_buf = torch.empty_like(out)
    res = mla_decode.decode(case.q, case.kv, case.qo_indptr, kv_scale=case.kv_scale,
                            block_table=case.block_table, kv_lens=case.kv_lens, page_size=case.page_size,
                            sm_scale=SM_SCALE, out=out_buf)
    assert res.data_ptr() == out_buf.data_ptr()
    assert torch.equal(res, out)


def test_page_size_one_and_64(device):
    for ps in (1, 64):
        case = make_case("bf16", "paged", 16, 1, [130, 1, 0], seed=ps, device=device, page_size=ps)
        out, lse = run_op(case)
        check_against_reference(case, out, lse)


def test_all_items_empty(device):
    case = make_case("mxfp4", "indptr", 16, 2, [0, 0], seed=5, device=device)
    out, lse = run_op(case)
    assert (out == 0).all()
    assert torch.isinf(lse).all() and (lse < 0).all()


@pytest.mark.parametrize("kv_len,nan_key", [(20, 3), (2600, 1700)])
def test_nan_in_used_row_propagates(device, kv_len, nan_key):
    """A NaN inside a row that IS attended must reach the output (no silent masking), also
    when the row's keys are split into chunks (2600 keys: the CPU's chunks, the GPU's splits)."""
    case = make_case("bf16", "indptr", 16, 1, [kv_len], seed=9, device=device)
    start = int(case.kv_indptr[0])
    case.kv[start + nan_key, 0, 7] = float("nan")
    out, lse = run_op(case)
    assert torch.isnan(out).all()
    assert torch.isnan(lse).all()


def test_mxfp4_block_scales_far_from_one(device):
    """Block exponents on both sides of 2^1, mixed within each token (even tokens E in
    110..126, odd tokens 118..134, so most odd tokens have blocks above 2^1 and below):
    the kernels apply the E8M0 scale to bf16 values, where 2^(E-1) overflows for E > 128,
    so large scales must not overflow and small blocks next to them must not vanish."""
    cpu = torch.device("cpu")
    case = make_case("mxfp4", "indptr", 16, 2, [150, 0, 70], seed=71, device=cpu)
    start, end = int(case.kv_indptr[0]), int(case.kv_indptr[-1])
    gen = torch.Generator().manual_seed(71)
    low = torch.where(torch.arange(end - start) % 2 == 0, 110, 118)
    exps = low[:, None] + torch.randint(0, 17, (end - start, 18), generator=gen)
    case.kv_scale.view(torch.uint8)[start:end, :18] = exps.to(torch.uint8)
    from mla_decode.reference import dequantize_cache, reference_decode
    case.ref_out, case.ref_lse = reference_decode(case.q, dequantize_cache(case.kv, case.kv_scale), case.qo_indptr,
                                                  SM_SCALE, kv_indptr=case.kv_indptr)
    for name in ("q", "kv", "kv_scale", "qo_indptr", "kv_indptr"):
        setattr(case, name, getattr(case, name).to(device))
    out, lse = run_op(case)
    check_against_reference(case, out, lse)
