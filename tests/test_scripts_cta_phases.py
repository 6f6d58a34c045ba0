"""scripts/cta_phases.py (the Hopper split kernels' per-CTA phase clocks, from a trace build): its
parsing of the probes' lines, the quantities it derives from them on synthetic calls, and its
argument checks. The probes themselves need a CUDA device and a trace build."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("cta_phases", ROOT / "scripts" / "cta_phases.py")
cp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cp)


def phases_line(kernel, role, x, y, sm, count, g0, g1, clocks):
    return " ".join(str(v) for v in ["PHASES", kernel, role, x, y, sm, count, g0, g1] + list(clocks))


def wide_call(offset_ns=0):
    # Two wide CTAs at 2 GHz (clocks / ns = 2), six tiles each. CTA (0, 0) starts at 1000 ns, CTA
    # (1, 0) 500 ns later. Scores: Q stored at 2000 cycles, QK(0) at 4000, QK(last) at 14000,
    # final at 20000 (10 us). Values: tiles requested at 100, PV(0) at 7000, PV(last) at 17000,
    # stored at 24000 (12 us).
    lines = []
    for x, start in ((0, 1000 + offset_ns), (1, 1500 + offset_ns)):
        lines.append(phases_line("wide", 0, x, 0, 10 + x, 6, start, start + 10000, [2000, 4000, 14000, 20000]))
        lines.append(phases_line("wide", 1, x, 0, 10 + x, 6, start, start + 12000, [100, 7000, 17000, 24000]))
    return lines


def test_the_quantities_of_a_synthetic_call():
    lines = ["DEVICE x", "TILES 0 1 2 3", "CALL 64 1024 0"] + wide_call() + ["END"]
    calls = cp.parse(lines)
    assert list(calls) == [(64, 1024)] and len(calls[(64, 1024)]) == 1
    q, span, ghz = cp.call_quantities(calls[(64, 1024)][0])
    assert span == pytest.approx(12.5)  # 1000 ns -> 1500 + 12000 ns
    assert ghz == pytest.approx([2.0] * 4)
    assert q["CTA start, after the first CTA's (us)"] == pytest.approx([0.0, 0.5])
    assert q["scores: start -> Q stored (us)"] == pytest.approx([1.0, 1.0])
    assert q["scores: start -> QK(0) done (us)"] == pytest.approx([2.0, 2.0])
    assert q["scores: start -> final (m, l) stored (us)"] == pytest.approx([10.0, 10.0])
    assert q["scores: QK(last) done -> final (m, l) stored (us)"] == pytest.approx([3.0, 3.0])
    assert q["scores: tile period, QK(0) done -> QK(last) done (cycles)"] == pytest.approx([2000.0, 2000.0])
    assert q["scores: tile period (us)"] == pytest.approx([1.0, 1.0])
    assert q["values: start -> PV(0) done (us)"] == pytest.approx([3.5, 3.5])
    assert q["values: PV(last) done -> outputs stored (us)"] == pytest.approx([3.5, 3.5])
    assert q["CTA finish, after the first CTA's start (us)"] == pytest.approx([12.0, 12.5])


def test_the_narrow_kernel_has_its_own_points():
    # Consumer: Q at 1000, QK(0) at 3000, QK(last) at 9000 (4 tiles: 2000 cycles each), PV(last)
    # at 11000, outputs at 13000; producers: the end at 12000.
    lines = ["CALL 4 8192 0", phases_line("narrow", 0, 0, 0, 1, 4, 0, 6500, [1000, 3000, 9000, 11000, 13000]),
             phases_line("narrow", 1, 0, 0, 1, 4, 0, 6000, [-1, -1, -1, -1, 12000])]
    q, span, ghz = cp.call_quantities(cp.parse(lines)[(4, 8192)][0])
    assert span == pytest.approx(6.5) and ghz == pytest.approx([2.0, 2.0])
    assert q["consumer: tile period, QK(0) done -> QK(last) done (cycles)"] == pytest.approx([2000.0])
    assert q["consumer: start -> PV(last) done (us)"] == pytest.approx([5.5])
    assert q["consumer: PV(last) done -> outputs stored (us)"] == pytest.approx([1.0])
    assert q["producers: start -> end (us)"] == pytest.approx([6.0])
    assert not any(k.startswith("producers: tile") for k in q)


def test_the_summary_takes_the_median_over_calls():
    lines = ["CALL 32 8192 0"] + wide_call() + ["CALL 32 8192 1"] + wide_call(offset_ns=7777)
    out = "\n".join(cp.summarise(cp.parse(lines), "bf16 H=128: "))
    assert "B=32 kv=8192: wide, 2 CTAs, 6 tiles per CTA (median), 2 calls; span 12.50 us" in out
    assert "SM clock 2.00 GHz" in out
    row = next(ln for ln in out.splitlines() if "CTA start" in ln)
    assert row.split()[-3:] == ["0.25", "0.00", "0.50"]


def test_points_not_reached_are_left_out():
    # A CTA with no keys (kv_len 0): its loop points stay -1, its span still counts.
    lines = ["CALL 4 8192 0", phases_line("wide", 0, 0, 0, 3, 0, 100, 2100, [1000, -1, -1, 4000]),
             phases_line("wide", 1, 0, 0, 3, 0, 100, 2100, [50, -1, -1, 4000])]
    q, span, ghz = cp.call_quantities(cp.parse(lines)[(4, 8192)][0])
    assert span == pytest.approx(2.0) and ghz == pytest.approx([2.0, 2.0])
    assert "scores: start -> QK(0) done (us)" not in q and not any("tile period" in k for k in q)
    assert q["scores: start -> Q stored (us)"] == pytest.approx([0.5])


def test_a_malformed_line_is_an_error_not_a_silent_figure():
    with pytest.raises(ValueError, match="PHASES line with 9 fields, expected 13 for wide"):
        cp.parse(["CALL 1 1 0", "PHASES wide 0 0 0 1 6 100 200"])
    with pytest.raises(ValueError, match="expected 14 for narrow"):
        cp.parse(["CALL 1 1 0", phases_line("narrow", 0, 0, 0, 1, 6, 100, 200, [1, 2, 3, 4])])
    with pytest.raises(ValueError, match="unknown kernel 'mma_sync'"):
        cp.parse(["CALL 1 1 0", phases_line("mma_sync", 0, 0, 0, 1, 6, 100, 200, [1, 2, 3, 4])])


def test_the_arguments_are_checked():
    for bad in (["--shapes", "64x1024"], ["--shapes", "0:1024"], ["--heads", "0"], ["--heads", "129"],
                ["--calls", "0"], ["--format", "fp4"]):
        with pytest.raises(SystemExit):
            cp.parse_args(bad)
    a = cp.parse_args(["--shapes", "64:1024,4:8192", "--format", "mxfp4", "--calls", "3", "--heads", "16",
                       "--protocol"])
    assert a.shapes == [(64, 1024), (4, 8192)] and a.format == "mxfp4" and a.calls == 3 and a.protocol


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU-only message")
def test_without_a_gpu_it_says_so():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "cta_phases.py")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode != 0 and "needs a CUDA device" in res.stderr


@pytest.mark.skipif(not __import__("mla_decode")._ops.native_available(), reason="needs the native library")
@pytest.mark.parametrize("protocol", [False, True])
def test_the_child_runs_its_calls_on_the_cpu(capsys, protocol):
    # The child's calls and their CALL / PLAN lines, on the CPU kernel (no probes there).
    cp.child("bf16", [(2, 70)], 16 if protocol else 128, 2, protocol=protocol, device="cpu")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "DEVICE cpu"
    assert out[1].startswith("PLAN 2 70 ")
    assert [ln for ln in out if ln.startswith("CALL")] == ["CALL 2 70 0", "CALL 2 70 1"]
    assert out[-1] == "END" and not any(ln.startswith("PHASES") for ln in out)
