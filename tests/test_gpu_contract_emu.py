"""The GPU's NaN contract for malformed index values, checked on the CPU: the kernels' work
assignment (csrc/kernels/common/work.cuh locate_work, csrc/common/addressing.h) compiled as
plain C++ (tests/gpu_emu/locate_work_emu.cpp, with AddressSanitizer where the compiler has
it) predicts which query rows a GPU call writes as NaN.

* Every BadValues case of the hostile table: the predicted NaN rows are the case's expected
  ones (tests/test_hostile.py checks the same rows on a GPU), for 1, 3 and 256 splits and both
  split alignments the kernels use (32: mma.sync / MFMA, 64: the Hopper kernels).
* Every valid case: no NaN row, and the splits tile each token's visible keys.
* Fuzzed index arrays (hypothesis): no read outside an index array (AddressSanitizer), and each
  token's prediction is the documented rule applied to the item it was given: NaN exactly when
  the token is outside that item's query rows, the item's values are untrusted, or a key it
  sees has a row outside the cache; a valid call gives every owned token its unique item."""

import os
import shutil
import subprocess

import pytest
import torch

from hostile_cases import BadValues, CASES, Runs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, "gpu_emu", "locate_work_emu.cpp")
MAX_KV_LENGTH = 2147418112  # kMaxKvLength, csrc/common/addressing.h
LAYOUTS = {"indptr": 0, "indices": 1, "paged": 2}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the work-assignment emulation")
    exe = str(tmp_path_factory.mktemp("emu") / "locate_work_emu")
    base = [cxx, "-std=c++17", "-O1", "-g", f"-I{os.path.join(HERE, 'gpu_emu')}", f"-I{os.path.join(ROOT, 'csrc')}",
            SOURCE, "-o", exe]
    sanitized = base[:1] + ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"] + base[1:]
    for cmd in (sanitized, base):
        if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
            return exe
    proc = subprocess.run(base, capture_output=True, text=True)
    pytest.fail(f"the emulation does not compile:\n{proc.stderr[-4000:]}")


def call_arrays(a):
    """The index arrays and sizes of a hostile-case call (CPU tensors)."""
    kv = a["kv_cache"]
    paged = a["block_table"] is not None
    layout = "paged" if paged else ("indices" if a["kv_indices"] is not None else "indptr")
    if kv.dim() == 2 or (kv.shape[1] == 1 and not (paged and a["page_size"] != 1)):
        rows = kv.shape[0]
    else:
        rows = kv.shape[0] * kv.shape[1]
    arr = dict(layout=layout, page_size=a["page_size"], rows=rows, total_q=a["q"].shape[0],
               qo=a["qo_indptr"].tolist(), max_pages=0, indices=[], kvp=None, lens=None, table=None)
    if paged:
        arr["lens"] = a["kv_lens"].tolist()
        arr["table"] = a["block_table"].contiguous().tolist()
        arr["max_pages"] = a["block_table"].shape[1]
    else:
        arr["kvp"] = a["kv_indptr"].tolist()
        if a["kv_indices"] is not None:
            arr["indices"] = a["kv_indices"].tolist()
    return arr


def predict(emulator, arr, num_splits, align):
    """{token: (item, orphan, nan, visible)} from the emulation."""
    batch = len(arr["qo"]) - 1
    ints = [LAYOUTS[arr["layout"]], arr["page_size"], arr["max_pages"], arr["rows"], len(arr["indices"]),
            arr["total_q"], batch, num_splits, align] + arr["qo"]
    if arr["layout"] == "paged":
        ints += arr["lens"] + [v for row in arr["table"] for v in row]
    else:
        ints += arr["kvp"] + arr["indices"]
    proc = subprocess.run([emulator], input=" ".join(map(str, ints)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"the emulation failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    out = {}
    for line in proc.stdout.split("\n"):
        if line:
            t, b, orphan, nan, visible = map(int, line.split())
            out[t] = (b, orphan, nan, visible)
    assert sorted(out) == list(range(arr["total_q"]))
    return out


GPU_CASES = [c for c in CASES if "cuda" in c.devices and isinstance(c.expectation("cuda"), (BadValues, Runs))
             and c.build("meta")["op"] in ("decode", "decode_out", "api_checked", "no_grad")]


@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_predicted_nan_rows_are_the_contract(emulator, case):
    a = case.build("cpu")
    if a["q"] is None or not isinstance(a["q"], torch.Tensor) or a["q"].dim() != 3:
        pytest.skip("no query rows")
    arr = call_arrays(a)
    exp = case.expectation("cuda")
    want = sorted(exp.nan_tokens) if isinstance(exp, BadValues) else []
    for num_splits in (1, 3, 256):
        for align in (32, 64):
            got = predict(emulator, arr, num_splits, align)
            nan = sorted(t for t, (_, _, is_nan, _) in got.items() if is_nan)
            assert nan == want, f"{num_splits} splits, align {align}: NaN rows {nan}, the contract says {want}"
            assert all(v >= 0 for (_, _, _, v) in got.values()), "the splits do not tile the visible keys"


# ---- fuzzing the rule ---------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis", reason="pip install hypothesis (the fuzz tests need it)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EDGES = [0, 1, -1, 2**31 - 1, -2**31, 2**31 - 2, 2**30, MAX_KV_LENGTH, MAX_KV_LENGTH + 1]


def value(lo, hi):
    return st.one_of(st.integers(lo, hi), st.sampled_from(EDGES))


@st.composite
def calls(draw):
    """Index arrays of one call: a valid one, then a few entries replaced (often by edge values)."""
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    batch = draw(st.integers(1, 6))
    q_lens = draw(st.lists(st.integers(0, 3), min_size=batch, max_size=batch))
    kv_lens = draw(st.lists(st.integers(0, 40), min_size=batch, max_size=batch))
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    total_q = qo[-1] + draw(st.sampled_from([0, 0, 0, 1]))  # sometimes rows no item owns
    arr = dict(layout=layout, page_size=1, max_pages=0, total_q=total_q, qo=qo, indices=[], kvp=None, lens=None,
               table=None)
    if layout == "paged":
        ps = draw(st.sampled_from([1, 7, 16]))
        max_pages = max(1, max((n + ps - 1) // ps for n in kv_lens))
        pages = max(1, sum((n + ps - 1) // ps for n in kv_lens))
        arr.update(page_size=ps, max_pages=max_pages, rows=pages * ps, lens=list(kv_lens),
                   table=[[draw(st.integers(0, pages - 1)) for _ in range(max_pages)] for _ in range(batch)])
    else:
        kvp = [0]
        for n in kv_lens:
            kvp.append(kvp[-1] + n)
        arr["kvp"] = kvp
        arr["rows"] = kvp[-1] + draw(st.integers(0, 5))
        if layout == "indices":
            arr["indices"] = [draw(st.integers(0, arr["rows"] - 1)) for _ in range(kvp[-1])] if arr["rows"] else []
            arr["indices"] += [0] * draw(st.integers(0, 3))
    # Corrupt a few entries.
    targets = ["qo"] + (["lens", "table"] if layout == "paged" else ["kvp"] + (["indices"] if arr["indices"] else []))
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(targets))
        if name == "table":
            row = draw(st.integers(0, batch - 1))
            arr["table"][row][draw(st.integers(0, arr["max_pages"] - 1))] = draw(value(-2, arr["rows"] + 2))
        else:
            arr[name][draw(st.integers(0, len(arr[name]) - 1))] = draw(value(-2, 50))
    return arr


def _trusted(x, batch, b, bound):
    begin, end = x[b], x[b + 1]
    before = x[b - 1] if b > 0 else begin
    after = x[b + 2] if b + 1 < batch else end
    return 0 <= begin <= end <= bound and before <= begin and end <= after


def _row(arr, b, j):
    if arr["layout"] == "paged":
        page_idx = j // arr["page_size"]
        if page_idx >= arr["max_pages"]:
            return -1
        row = arr["table"][b][page_idx] * arr["page_size"] + j % arr["page_size"]
    elif arr["layout"] == "indices":
        pos = arr["kvp"][b] + j
        if pos < 0 or pos >= len(arr["indices"]):
            return -1
        row = arr["indices"][pos]
    else:
        row = arr["kvp"][b] + j
    return row if 0 <= row < arr["rows"] else -1


def expected_for(arr, t, b):
    """(nan, visible) of token t computed as item b, by the documented rule (addressing.h)."""
    qo, batch = arr["qo"], len(arr["qo"]) - 1
    ok = _trusted(qo, batch, b, arr["total_q"])
    if arr["layout"] == "paged":
        length = arr["lens"][b]
        ok = ok and 0 <= length <= arr["max_pages"] * arr["page_size"]
    else:
        bound = len(arr["indices"]) if arr["layout"] == "indices" else arr["rows"]
        ok = ok and _trusted(arr["kvp"], batch, b, bound)
        length = arr["kvp"][b + 1] - arr["kvp"][b]
    ok = ok and length <= MAX_KV_LENGTH
    if not ok or not qo[b] <= t < qo[b + 1]:
        return True, 0
    q_len, i = qo[b + 1] - qo[b], t - qo[b]
    visible = min(max(length - q_len + i + 1, 0), length)
    return any(_row(arr, b, j) < 0 for j in range(visible)), visible


def _valid(arr):
    qo = arr["qo"]
    if qo[0] != 0 or any(b > a for a, b in zip(qo[1:], qo)) or qo[-1] > arr["total_q"]:
        return False
    return all(not expected_for(arr, t, b)[0] for b in range(len(qo) - 1) for t in range(qo[b], qo[b + 1]))


FUZZ_EXAMPLES = int(os.environ.get("MLA_DECODE_FUZZ_EXAMPLES", "0")) or None  # tests/test_fuzz.py's size knob


@settings(max_examples=FUZZ_EXAMPLES or 200, derandomize=FUZZ_EXAMPLES is None, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(arr=calls(), num_splits=st.sampled_from([1, 2, 5, 256]), align=st.sampled_from([32, 64]))
def test_fuzzed_index_values_follow_the_rule(emulator, arr, num_splits, align):
    got = predict(emulator, arr, num_splits, align)  # AddressSanitizer: no read outside an array
    qo = arr["qo"]
    for t, (b, orphan, nan, visible) in got.items():
        assert 0 <= b < len(qo) - 1
        want_nan, want_visible = expected_for(arr, t, b)
        assert nan == want_nan, (t, b, got[t], arr)
        if not orphan:
            assert visible == want_visible, (t, b, got[t], arr)
    if _valid(arr):  # a well-formed call: every owned token finite, computed as its own item
        for t, (b, orphan, nan, visible) in got.items():
            owners = [i for i in range(len(qo) - 1) if qo[i] <= t < qo[i + 1]]
            assert nan == (not owners) and (not owners or owners == [b]), (t, got[t], arr)
