"""Bad input gets a clear error naming the argument, expected and actual
value: never a crash, a hang or a silent wrong answer. Table-driven; every
row asserts its message. Runs on every available device."""

import pytest
import torch

import mla_decode
from cases import SM_SCALE

B, H = 3, 16


def good(device):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(40, 1, 576, generator=g).to(torch.bfloat16)
    args = dict(q=q, kv_cache=kv, kv_scale=None, qo_indptr=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
                kv_indptr=torch.tensor([0, 10, 10, 30], dtype=torch.int32), kv_indices=None, block_table=None,
                kv_lens=None, page_size=1, sm_scale=SM_SCALE, num_splits=0)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def call(a):
    return torch.ops.mla_decode.decode(a["q"], a["kv_cache"], a["kv_scale"], a["qo_indptr"], a["kv_indptr"],
                                       a["kv_indices"], a["block_table"], a["kv_lens"], a["page_size"],
                                       a["sm_scale"], a["num_splits"])


def fp8_cache(a):
    a["kv_cache"] = a["kv_cache"].to(torch.float8_e4m3fn)
    a["kv_scale"] = torch.ones(1, device=a["q"].device)


def mx_cache(a, rows=40, cols=18, dtype=torch.uint8):
    a["kv_cache"] = torch.zeros(40, 1, 288, dtype=torch.uint8, device=a["q"].device)
    a["kv_scale"] = torch.full((rows, cols), 127, dtype=dtype, device=a["q"].device)


def paged(a, table_rows=B, lens=True, page_size=8):
    dev = a["q"].device
    a["kv_cache"] = a["kv_cache"].view(5, 8, 1, 576)
    a["kv_indptr"] = None
    a["block_table"] = torch.zeros(table_rows, 2, dtype=torch.int32, device=dev)
    a["kv_lens"] = torch.tensor([3, 0, 8], dtype=torch.int32, device=dev) if lens else None
    a["page_size"] = page_size


CASES = [
    # (id, mutation, expected message fragment)
    ("q dtype", lambda a: a.update(q=a["q"].float()), "q must be bfloat16, but it is Float"),
    ("q rank", lambda a: a.update(q=a["q"][0]), "q must be 3-D (total_q, num_heads, 576)"),
    ("q head dim", lambda a: a.update(q=a["q"][..., :512]), "q's last dim must be 576"),
    ("q too many heads", lambda a: a.update(q=a["q"].repeat(1, 9, 1)), "1 to 128 heads, but it has 144"),
    ("q last dim strided", lambda a: a.update(q=a["q"].repeat_interleave(2, -1)[..., ::2]),
     "q's last dim must be contiguous"),
    ("cache dtype", lambda a: a.update(kv_cache=a["kv_cache"].half()), "kv_cache must be bfloat16, float8_e4m3fn"),
    ("cache head dim", lambda a: a.update(kv_cache=a["kv_cache"][..., :512]),
     "bfloat16 kv_cache must have 576 elements per row"),
    ("cache rank", lambda a: a.update(kv_cache=a["kv_cache"].view(40 * 576)), "kv_cache must be 2-D"),
    ("paged cache without table", lambda a: a.update(kv_cache=a["kv_cache"].view(5, 8, 576)),
     "is paged (pages, page_size, ...) but no block_table was given"),
    ("bf16 with scale", lambda a: a.update(kv_scale=torch.ones(1, device=a["q"].device)),
     "kv_scale must be None for a bfloat16 kv_cache"),
    ("fp8 without scale", lambda a: (fp8_cache(a), a.update(kv_scale=None)), "an fp8 kv_cache needs kv_scale"),
    ("fp8 scale dtype", lambda a: (fp8_cache(a), a.update(kv_scale=a["kv_scale"].double())),
     "fp8 kv_scale must be float32, but it is Double"),
    ("fp8 scale shape", lambda a: (fp8_cache(a), a.update(kv_scale=torch.ones(2, device=a["q"].device))),
     "fp8 kv_scale must hold one value"),
    ("mxfp4 scale rows", lambda a: mx_cache(a, rows=39), "MXFP4 kv_scale must have at least 40 rows and 18 columns"),
    ("mxfp4 scale cols", lambda a: mx_cache(a, cols=17), "MXFP4 kv_scale must have at least 40 rows and 18 columns"),
    ("mxfp4 scale dtype", lambda a: mx_cache(a, dtype=torch.int32), "MXFP4 kv_scale must be uint8 or float8_e8m0fnu"),
    ("mxfp4 row bytes", lambda a: (mx_cache(a), a.update(kv_cache=a["kv_cache"][..., :144])),
     "mxfp4 kv_cache must have 288 elements per row"),
    ("qo_indptr dtype", lambda a: a.update(qo_indptr=a["qo_indptr"].long()), "qo_indptr must be int32, but it is Long"),
    ("qo_indptr too short", lambda a: a.update(qo_indptr=a["qo_indptr"][:1]), "qo_indptr must have batch_size + 1 >= 2"),
    ("kv_indptr length", lambda a: a.update(kv_indptr=a["kv_indptr"][:3]),
     "qo_indptr and kv_indptr must have the same length, batch_size + 1, but qo_indptr has 4 entries (batch_size 3) "
     "and kv_indptr has 3 (batch_size 2)"),
    ("qo_indptr one entry too long", lambda a: a.update(qo_indptr=torch.tensor([0, 1, 2, 3, 3], dtype=torch.int32,
                                                                               device=a["q"].device)),
     "qo_indptr and kv_indptr must have the same length, batch_size + 1, but qo_indptr has 5 entries (batch_size 4) "
     "and kv_indptr has 4 (batch_size 3)"),
    ("kv_lens length", lambda a: (paged(a), a.update(kv_lens=a["kv_lens"][:2])),
     "kv_lens must have batch_size entries and qo_indptr batch_size + 1, but qo_indptr has 4 entries (batch_size 3) "
     "and kv_lens has 2"),
    ("kv_indptr dtype", lambda a: a.update(kv_indptr=a["kv_indptr"].long()), "kv_indptr must be int32"),
    ("no addressing", lambda a: a.update(kv_indptr=None), "neither kv_indptr nor block_table was given"),
    ("indices dtype", lambda a: a.update(kv_indices=torch.arange(30, device=a["q"].device)),
     "kv_indices must be int32, but it is Long"),
    ("page size with indptr", lambda a: a.update(page_size=16), "page_size must be 1 with kv_indptr"),
    ("table without lens", lambda a: paged(a, lens=False), "block_table was given without kv_lens"),
    ("table rows", lambda a: paged(a, table_rows=2),
     "block_table must have one row per item, batch_size = 3 (qo_indptr has 4 entries), but it has shape [2, 2]"),
    ("page dim mismatch", lambda a: paged(a, page_size=4), "kv_cache's dim 1 is the page size (4), but it is 8"),
    ("table and indptr", lambda a: (paged(a), a.update(kv_indptr=torch.zeros(4, dtype=torch.int32,
                                                                             device=a["q"].device))),
     "give either kv_indptr (with optional kv_indices) or block_table with kv_lens, not both"),
    ("sm_scale nan", lambda a: a.update(sm_scale=float("nan")), "sm_scale must be finite and nonzero"),
    ("num_splits", lambda a: a.update(num_splits=1000), "num_splits must be in [0, 256]"),
    ("device mismatch", lambda a: a.update(qo_indptr=a["qo_indptr"].cpu()),
     "qo_indptr must be on the same device as q"),
]

# Value checks: the CPU reads index tensors and rejects bad values. (On the
# GPU that would need a host sync; there a bad index produces NaN rows,
# tested in test_gpu.py.)
VALUE_CASES = [
    ("qo_indptr start", lambda a: a.update(qo_indptr=torch.tensor([1, 1, 2, 3], dtype=torch.int32)),
     "qo_indptr[0] must be 0, but it is 1"),
    ("qo_indptr decreasing", lambda a: a.update(qo_indptr=torch.tensor([0, 2, 1, 3], dtype=torch.int32)),
     "qo_indptr must be non-decreasing"),
    ("qo_indptr end", lambda a: a.update(qo_indptr=torch.tensor([0, 1, 2, 2], dtype=torch.int32)),
     "qo_indptr[-1] must equal q.size(0) = 3, but it is 2"),
    ("kv_indptr past cache", lambda a: a.update(kv_indptr=torch.tensor([0, 10, 10, 41], dtype=torch.int32)),
     "kv_indptr[-1] = 41 exceeds the kv_cache's 40 rows"),
    ("kv_indptr decreasing", lambda a: a.update(kv_indptr=torch.tensor([0, 10, 9, 30], dtype=torch.int32)),
     "kv_indptr must be non-decreasing"),
    ("index out of range", lambda a: a.update(kv_indices=torch.tensor([0] * 29 + [40], dtype=torch.int32)),
     "kv_indices[29] = 40 is not a row of kv_cache (40 rows)"),
    ("indices too short", lambda a: a.update(kv_indices=torch.zeros(20, dtype=torch.int32)),
     "kv_indptr[-1] = 30 exceeds the length of kv_indices (20)"),
    ("page out of range", lambda a: (paged(a), a["block_table"].__setitem__((2, 0), 5)),
     "block_table[2][0] = 5 is not a page of kv_cache (5 pages)"),
    ("kv_lens too long", lambda a: (paged(a), a["kv_lens"].__setitem__(0, 17)),
     "kv_lens[0] = 17 must be in [0, max_pages x page_size = 16]"),
]


@pytest.mark.parametrize("name,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_message(device, name, mutate, message):
    if name == "device mismatch" and device.type == "cpu":
        pytest.skip("needs a second device type")
    a = good(device)
    mutate(a)
    with pytest.raises(RuntimeError) as info:
        call(a)
    assert message in str(info.value), f"{name}: got {info.value}"


@pytest.mark.parametrize("name,mutate,message", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_bad_index_values_on_cpu(name, mutate, message):
    a = good("cpu")
    mutate(a)
    with pytest.raises(RuntimeError) as info:
        call(a)
    assert message in str(info.value), f"{name}: got {info.value}"


def test_good_input_runs(device):
    out, lse = call(good(device))
    assert out.shape == (B, H, 512) and lse.shape == (B, H)
    assert torch.isfinite(out).all()


def test_query_rows_beyond_int32_are_refused(device):
    """total_q x H > 2^31 - 1 is refused before anything is allocated or launched."""
    rows = 2**31 // 16 + 1
    q = torch.zeros(1, 1, 576, dtype=torch.bfloat16, device=device).expand(rows, 16, 576)
    a = good(device)
    out = torch.empty(1, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(1, 16, dtype=torch.float32, device=device)
    with pytest.raises(RuntimeError, match="more than the int32 limit"):
        torch.ops.mla_decode.decode_out(q, a["kv_cache"], None, a["qo_indptr"], a["kv_indptr"], None, None, None,
                                        1, SM_SCALE, 0, out, lse)


# ---- the checked mode's operator, the fake kernels, autograd ------------------------------------

def _check_op(a):
    return torch.ops.mla_decode._check_index_values(a["q"], a["kv_cache"], a["kv_scale"], a["qo_indptr"],
                                                    a["kv_indptr"], a["kv_indices"], a["block_table"],
                                                    a["kv_lens"], a["page_size"])


@pytest.mark.parametrize("name,mutate,message", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_check_index_values_op_gives_the_cpu_message(device, name, mutate, message):
    """_check_index_values (decode(checked=True) on a GPU) raises what the CPU's decode raises, on
    any device: a GPU's index tensors are copied to the host for it."""
    a = good("cpu")
    mutate(a)
    a = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    with pytest.raises(RuntimeError) as info:
        _check_op(a)
    assert message in str(info.value), f"{name}: got {info.value}"


def test_check_index_values_op_accepts_good_values(device):
    assert _check_op(good(device)) is None
    a = good(device)
    paged(a)
    assert _check_op(a) is None


def test_checked_decode_runs_on_good_input(device):
    a = good(device)
    out = mla_decode.decode(a["q"], a["kv_cache"], a["qo_indptr"], kv_indptr=a["kv_indptr"], checked=True)
    ref = mla_decode.decode(a["q"], a["kv_cache"], a["qo_indptr"], kv_indptr=a["kv_indptr"])
    assert torch.equal(out, ref)


def test_the_check_is_not_dead_code_to_graph_passes():
    """It returns nothing and writes nothing, so torch.compile would drop it unless marked."""
    node = torch.fx.node
    if not hasattr(node, "_side_effectful_functions"):
        pytest.skip("this torch has no side-effect registry")
    assert torch.ops.mla_decode._check_index_values.default in node._side_effectful_functions


def test_check_index_values_opcheck():
    a = good("cpu")
    torch.library.opcheck(torch.ops.mla_decode._check_index_values.default,
                          (a["q"], a["kv_cache"], None, a["qo_indptr"], a["kv_indptr"], None, None, None, 1),
                          test_utils=("test_schema", "test_faketensor"))


def test_fake_kernel_refuses_what_the_real_one_refuses():
    """Every shape case of this module, on meta tensors: the same message as on the CPU."""
    for name, mutate, message in CASES:
        if name == "device mismatch":
            continue
        a = good("cpu")
        mutate(a)
        a = {k: (torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                 if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
        with pytest.raises(RuntimeError) as info:
            call(a)
        assert message in str(info.value), f"{name}: got {info.value}"


def test_a_meta_tensor_among_cpu_tensors_is_refused():
    a = good("cpu")
    a["kv_cache"] = a["kv_cache"].to("meta")
    with pytest.raises(RuntimeError, match=r"kv_cache must be on the same device as q \(cpu\), but it is on meta"):
        call(a)
    a = good("cpu")
    out = torch.empty(B, H, 512, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(B, H, dtype=torch.float32, device="meta")
    with pytest.raises(RuntimeError, match=r"out must be on the same device as q \(cpu\), but it is on meta"):
        torch.ops.mla_decode.decode_out(*[a[k] for k in ("q", "kv_cache", "kv_scale", "qo_indptr", "kv_indptr",
                                                         "kv_indices", "block_table", "kv_lens", "page_size",
                                                         "sm_scale", "num_splits")], out, lse)


def test_backward_raises_a_clear_error(device):
    a = good(device)
    q = a["q"].float().requires_grad_()
    out, lse = torch.ops.mla_decode.decode(q.bfloat16(), a["kv_cache"], None, a["qo_indptr"], a["kv_indptr"], None,
                                           None, None, 1, SM_SCALE, 0)
    assert out.requires_grad and lse.requires_grad
    with pytest.raises(RuntimeError, match="mla_decode.decode is not differentiable"):
        out.float().sum().backward()
    with torch.no_grad():
        out, _ = torch.ops.mla_decode.decode(q.bfloat16(), a["kv_cache"], None, a["qo_indptr"], a["kv_indptr"], None,
                                             None, None, 1, SM_SCALE, 0)
    assert not out.requires_grad


def test_decode_out_refuses_inputs_that_require_grad(device):
    a = good(device)
    out = torch.empty(B, H, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(B, H, dtype=torch.float32, device=device)
    q = a["q"].float().requires_grad_().bfloat16()
    with pytest.raises(RuntimeError, match="mla_decode.decode_out is not differentiable, but q requires grad"):
        torch.ops.mla_decode.decode_out(q, a["kv_cache"], None, a["qo_indptr"], a["kv_indptr"], None, None, None, 1,
                                        SM_SCALE, 0, out, lse)
    version = out._version
    torch.ops.mla_decode.decode_out(a["q"], a["kv_cache"], None, a["qo_indptr"], a["kv_indptr"], None, None, None, 1,
                                    SM_SCALE, 0, out, lse)
    assert out._version > version  # the write is visible to autograd's version counter


def test_issue_findings_are_hostile_cases():
    """Each finding of the hostile-input review has its case in tests/hostile_cases.py."""
    from hostile_cases import by_id
    table = by_id()
    for case_id in ("block table page count past int32", "device kv_cache", "device out",
                    "paged (pages, 1, 1, 576) padded rows", "out overlaps itself", "backward through decode",
                    "qo_indptr decreasing", "kv_indptr decreasing", "qo_indptr past q", "kv_lens negative",
                    "device q", "qo_indptr one entry too long"):
        assert case_id in table, case_id
