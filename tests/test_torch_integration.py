"""opcheck, torch.compile(fullgraph=True) and (on a GPU) CUDA-graph capture."""

import pytest
import torch

import mla_decode  # noqa: F401
from cases import SM_SCALE, check_against_reference, kernel_variants, make_case


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_opcheck_decode(device, fmt):
    case = make_case(fmt, "indices", 16, 2, [9, 0, 21], seed=21, device=device)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if fmt == "fp8":
        # test_schema compares inputs before/after with arithmetic that torch
        # does not implement for float8 tensors ("mul_cpu_reduced_float"); the
        # bf16 and MXFP4 runs cover the schema's aliasing claims.
        utils = utils[1:]
    torch.library.opcheck(torch.ops.mla_decode.decode.default, (*case.args(), 0), test_utils=utils)


def test_opcheck_decode_out(device):
    case = make_case("bf16", "paged", 16, 1, [9, 17], seed=22, device=device)
    out = torch.empty(case.q.shape[0], 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(case.q.shape[0], 16, dtype=torch.float32, device=device)
    torch.library.opcheck(torch.ops.mla_decode.decode_out.default, (*case.args(), 0, out, lse))


def test_torch_compile_fullgraph(device):
    case = make_case("fp8", "indptr", 16, 1, [33, 12], seed=23, device=device)

    def step(q, kv, scale, qo, kvp):
        out, lse = torch.ops.mla_decode.decode(q, kv, scale, qo, kvp, None, None, None, 1, SM_SCALE, 0)
        return out.float() * 2.0, lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if device.type == "cpu" else "inductor")
    out2, lse = compiled(case.q, case.kv, case.kv_scale, case.qo_indptr, case.kv_indptr)
    check_against_reference(case, (out2 / 2).to(torch.bfloat16), lse)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("num_splits", [0, 4])
@pytest.mark.parametrize("num_heads", [16, 128])
def test_cuda_graph_replay_with_new_lengths(fmt, num_splits, num_heads):
    """Capture once, then change lengths (same batch size) and replay (twice). num_splits
    0: the planned split; 4: a forced split with the combine kernel in the graph. On every kernel
    that can run the call (cases.kernel_variants: the Hopper wide kernel at 128 heads, the narrow
    kernels at 16, the mma.sync kernel with both ring sets)."""
    dev = torch.device("cuda")
    probe = make_case(fmt, "indptr", num_heads, 1, [200, 50, 0, 400], seed=31, device=dev, extra_rows=600)
    for overrides in kernel_variants(probe):
        _graph_replay_with_new_lengths(fmt, num_splits, num_heads, overrides)


def _graph_replay_with_new_lengths(fmt, num_splits, num_heads, overrides):
    dev = torch.device("cuda")
    case = make_case(fmt, "indptr", num_heads, 1, [200, 50, 0, 400], seed=31, device=dev, extra_rows=600)
    static = dict(q=case.q.clone(), kvp=case.kv_indptr.clone())
    out = torch.empty(case.q.shape[0], num_heads, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(case.q.shape[0], num_heads, dtype=torch.float32, device=dev)

    def run():
        mla_decode.decode(static["q"], case.kv, case.qo_indptr, kv_scale=case.kv_scale, kv_indptr=static["kvp"],
                          sm_scale=SM_SCALE, num_splits=num_splits, out=out, lse=lse, _overrides=overrides)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # warm-up outside capture (sets the shared-memory attribute)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(case, out, lse)

    # New lengths over the same cache rows: rebuild a case with the same cache
    # and copy its indptr into the captured buffer.
    case2 = make_case(fmt, "indptr", num_heads, 1, [10, 0, 700, 33], seed=32, device=dev, extra_rows=300)
    total_rows = case2.kv.shape[0]
    assert total_rows <= case.kv.shape[0]
    case.kv[:total_rows].copy_(case2.kv)
    if case2.kv_scale is not None:
        if fmt == "mxfp4":
            case.kv_scale[:total_rows].copy_(case2.kv_scale)
        else:
            case.kv_scale.copy_(case2.kv_scale)
    static["q"].copy_(case2.q)
    static["kvp"].copy_(case2.kv_indptr)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(case2, out, lse)
    out.fill_(float("nan"))
    graph.replay()  # a second replay of the same graph gives the same result
    torch.cuda.synchronize()
    check_against_reference(case2, out, lse)
