"""Differential fuzzing of decode against the float64 reference (hypothesis).

Each example draws a call: H 1..128, ragged q_len 1..8 per item, ragged KV lengths including
0, every cache format (bf16, fp8 e4m3fn / e4m3fnuz, MXFP4) and addressing mode (indptr,
indices, paged with page sizes 1, 7, 16, 64, its pages shuffled and sometimes shared between
items or repeated within one), NaN in every cache row no token reads, a forced split count,
and the functional op or preallocated (NaN-filled, sometimes padded) outputs. The result must
match reference_decode on the same dequantised cache (tests/cases.py check_against_reference:
the kernels read the values the reference reads, so each format's tolerance is the output's
rounding budget, the same for all four), and a repeated call must be bitwise identical.

On a GPU the same examples run on every kernel that can run them (cases.kernel_variants).

Size: MLA_DECODE_FUZZ_EXAMPLES examples per device (default 120, derandomized: the same
examples every run, well inside CI's 3 minutes); a longer, random run:
    MLA_DECODE_FUZZ_EXAMPLES=2000 python3 -m pytest -q tests/test_fuzz.py
"""

import os

import pytest
import torch

from cases import SM_SCALE, Case, _poison_rows, _quantize, check_against_reference, kernel_variants

hypothesis = pytest.importorskip("hypothesis", reason="pip install hypothesis (the fuzz tests need it)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mla_decode.reference import dequantize_cache, reference_decode  # noqa: E402

EXAMPLES = int(os.environ.get("MLA_DECODE_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=EXAMPLES or 120, derandomize=EXAMPLES is None, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FORMATS = ("bf16", "fp8", "fp8_fnuz", "mxfp4")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@st.composite
def problems(draw):
    batch = draw(st.integers(1, 4))
    return dict(
        fmt=draw(st.sampled_from(FORMATS)),
        layout=draw(st.sampled_from(["indptr", "indices", "paged"])),
        heads=draw(st.one_of(st.sampled_from([1, 16, 64, 128]), st.integers(1, 128))),
        q_lens=draw(st.lists(st.integers(1, 8), min_size=batch, max_size=batch)),
        kv_lens=draw(st.lists(st.one_of(st.just(0), st.integers(1, 40), st.integers(41, 300)),
                              min_size=batch, max_size=batch)),
        page_size=draw(st.sampled_from([1, 7, 16, 64])),
        share_pages=draw(st.booleans()),
        num_splits=draw(st.sampled_from([0, 0, 1, 3, 16])),
        outputs=draw(st.sampled_from(["functional", "preallocated", "padded"])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def build(pr, device):
    """A cases.Case for problem `pr`: random data, NaN in every unused cache row, the reference."""
    g = torch.Generator().manual_seed(pr["seed"])
    q_lens, kv_lens, ps = pr["q_lens"], pr["kv_lens"], pr["page_size"]
    batch, total_q = len(q_lens), sum(q_lens)
    q = torch.randn(total_q, pr["heads"], 576, generator=g).to(torch.bfloat16)
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    case = Case(q=q, kv=None, kv_scale=None, qo_indptr=qo, lengths=list(kv_lens))
    if pr["layout"] == "paged":
        pages_per_item = [(n + ps - 1) // ps for n in kv_lens]
        num_pages = sum(pages_per_item) + 2
        n_rows = num_pages * ps
        perm = torch.randperm(num_pages, generator=g).tolist()
        table = torch.full((batch, max(max(pages_per_item), 1) + 1), -7, dtype=torch.int32)  # unused: never read
        k = 0
        for b, n in enumerate(pages_per_item):
            for i in range(n):
                if pr["share_pages"] and k > 0 and torch.rand((), generator=g) < 0.4:
                    table[b, i] = perm[int(torch.randint(k, (), generator=g))]  # a page read twice
                else:
                    table[b, i] = perm[k]
                    k += 1
        case.block_table, case.kv_lens, case.page_size = table, torch.tensor(kv_lens, dtype=torch.int32), ps
    else:
        n_rows = sum(kv_lens) + 9
        offsets = [3]
        for n in kv_lens:
            offsets.append(offsets[-1] + n)
        case.kv_indptr = torch.tensor(offsets if pr["layout"] == "indptr" else [o - 3 for o in offsets],
                                      dtype=torch.int32)
        if pr["layout"] == "indices":
            rows = torch.randperm(n_rows, generator=g)[:sum(kv_lens)]
            if pr["share_pages"] and rows.numel() > 1:  # some rows read twice
                dup = torch.rand(rows.numel(), generator=g) < 0.3
                rows[dup] = rows[0]
            case.kv_indices = rows.to(torch.int32)
    kv, scale = _quantize(torch.randn(n_rows, 576, generator=g).to(torch.bfloat16), pr["fmt"])
    used = torch.zeros(n_rows, dtype=torch.bool)
    for b, n in enumerate(kv_lens):
        for j in range(n):
            if pr["layout"] == "paged":
                used[int(case.block_table[b, j // ps]) * ps + j % ps] = True
            elif pr["layout"] == "indices":
                used[int(case.kv_indices[int(case.kv_indptr[b]) + j])] = True
            else:
                used[int(case.kv_indptr[b]) + j] = True
    _poison_rows(kv, scale, pr["fmt"], (~used).nonzero().flatten())
    case.kv = kv.view(n_rows // ps, ps, 1, kv.shape[-1]) if pr["layout"] == "paged" else kv
    case.kv_scale = scale
    case.ref_out, case.ref_lse = reference_decode(
        q, dequantize_cache(case.kv, scale, dtype=torch.float64), qo, SM_SCALE, kv_indptr=case.kv_indptr,
        kv_indices=case.kv_indices, block_table=case.block_table, kv_lens=case.kv_lens, page_size=case.page_size)
    for name in ("q", "kv", "kv_scale", "qo_indptr", "kv_indptr", "kv_indices", "block_table", "kv_lens"):
        t = getattr(case, name)
        setattr(case, name, None if t is None else t.to(device))
    return case


def run(case, pr, overrides):
    rows, heads, dev = case.q.shape[0], case.q.shape[1], case.q.device
    if pr["outputs"] == "functional" and overrides is None:
        return torch.ops.mla_decode.decode(*case.args(), pr["num_splits"])
    width = 520 if pr["outputs"] == "padded" else 512
    out = torch.full((rows, heads, width), float("nan"), dtype=torch.bfloat16, device=dev)[..., :512]
    lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=dev)
    if overrides is None:
        torch.ops.mla_decode.decode_out(*case.args(), pr["num_splits"], out, lse)
    else:
        from mla_decode.api import _overrides_text
        torch.ops.mla_decode._decode_out_with(*case.args(), pr["num_splits"], out, lse, _overrides_text(overrides))
    return out, lse


def bits(t):
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).cpu()


@pytest.mark.parametrize("device", DEVICES)
@FUZZ
@given(pr=problems())
def test_decode_matches_the_reference(device, pr):
    case = build(pr, torch.device(device))
    for overrides in kernel_variants(case):
        out, lse = run(case, pr, overrides)
        try:
            check_against_reference(case, out, lse)
        except AssertionError as e:
            raise AssertionError(f"{overrides or 'the plan'}: {e}") from e
        out2, lse2 = run(case, pr, overrides)
        assert torch.equal(bits(out), bits(out2)) and torch.equal(bits(lse), bits(lse2)), \
            f"{overrides or 'the plan'}: a repeated call is not bitwise identical"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_repeated_calls_are_bitwise_identical(device, fmt):
    """Splits, partial merges and many items: ten identical calls, one bit pattern (NaN rows
    included: a bad index makes one item NaN)."""
    pr = dict(fmt=fmt, layout="indices", heads=32, q_lens=[1, 3, 2, 1], kv_lens=[1500, 0, 77, 700],
              page_size=1, share_pages=True, num_splits=0, outputs="preallocated", seed=99)
    case = build(pr, torch.device(device))
    case.kv_indices[1600] = 10**9 if device == "cuda" else case.kv_indices[1600]  # the GPU: one NaN item
    for overrides in kernel_variants(case):
        for num_splits in (0, 5):
            pr["num_splits"] = num_splits
            first = [bits(t) for t in run(case, pr, overrides)]
            for _ in range(9):
                again = [bits(t) for t in run(case, pr, overrides)]
                assert all(torch.equal(a, b) for a, b in zip(first, again)), (overrides, num_splits)
