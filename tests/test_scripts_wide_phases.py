"""scripts/wide_phases.py (the wide kernel's per-CTA phase clocks, from a trace build): its parsing
of the probes' lines, the quantities it derives from them on synthetic calls, and its argument
checks. The probes themselves need a CUDA device and a trace build."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("wide_phases", ROOT / "scripts" / "wide_phases.py")
wp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wp)


def phases_line(role, x, y, sm, count, g0, g1, clocks):
    return " ".join(str(v) for v in ["PHASES", role, x, y, sm, count, g0, g1] + list(clocks))


def synthetic_call(offset_ns=0):
    # Two CTAs at 2 GHz (clocks / ns = 2), six tiles each. CTA (0, 0) starts at 1000 ns; CTA (1, 0)
    # 500 ns later. Scores: Q stored at 2000 cycles, QK(0) at 4000, QK(last) at 14000, final at
    # 20000 (10 us). Values: tiles requested at 100, PV(0) at 7000, PV(last) at 17000, stored at
    # 24000 (12 us).
    lines = []
    for x, start in ((0, 1000 + offset_ns), (1, 1500 + offset_ns)):
        lines.append(phases_line(0, x, 0, 10 + x, 6, start, start + 10000, [2000, 4000, 14000, 20000]))
        lines.append(phases_line(1, x, 0, 10 + x, 6, start, start + 12000, [100, 7000, 17000, 24000]))
    return lines


def test_the_quantities_of_a_synthetic_call():
    lines = ["DEVICE x", "TILES 0 1 2 3", "CALL 64 1024 0"] + synthetic_call() + ["END"]
    calls = wp.parse(lines)
    assert list(calls) == [(64, 1024)] and len(calls[(64, 1024)]) == 1
    q, span, ghz = wp.call_quantities(calls[(64, 1024)][0])
    assert span == pytest.approx(12.5)  # 1000 ns -> 1500 + 12000 ns
    assert ghz == pytest.approx([2.0] * 4)
    assert q["start (us)"] == pytest.approx([0.0, 0.5])
    assert q["scores: start -> Q stored (us)"] == pytest.approx([1.0, 1.0])
    assert q["scores: start -> QK(0) done (us)"] == pytest.approx([2.0, 2.0])
    assert q["scores: per tile after the first (cycles)"] == pytest.approx([2000.0, 2000.0])
    assert q["scores: per tile after the first (us)"] == pytest.approx([1.0, 1.0])
    assert q["scores: QK(last) -> final stored (us)"] == pytest.approx([3.0, 3.0])
    assert q["values: start -> PV(0) done (us)"] == pytest.approx([3.5, 3.5])
    assert q["values: PV(last) -> outputs stored (us)"] == pytest.approx([3.5, 3.5])
    assert q["finish (us)"] == pytest.approx([12.0, 12.5])


def test_the_summary_takes_the_median_over_calls():
    lines = ["CALL 32 8192 0"] + synthetic_call() + ["CALL 32 8192 1"] + synthetic_call(offset_ns=7777)
    out = "\n".join(wp.summarise(wp.parse(lines), "bf16 H=128 "))
    assert "B=32 kv=8192: 2 CTAs, 6 tiles per CTA (median), 2 calls; span 12.50 us" in out
    assert "SM clock 2.00 GHz" in out
    row = next(ln for ln in out.splitlines() if "start (us)" in ln and "scores" not in ln)
    assert row.split()[-3:] == ["0.25", "0.00", "0.50"]


def test_points_not_reached_are_left_out():
    # A CTA with no keys (kv_len 0): its loop points stay -1, its span still counts.
    lines = ["CALL 4 8192 0", phases_line(0, 0, 0, 3, 0, 100, 2100, [1000, -1, -1, 4000]),
             phases_line(1, 0, 0, 3, 0, 100, 2100, [50, -1, -1, 4000])]
    q, span, ghz = wp.call_quantities(wp.parse(lines)[(4, 8192)][0])
    assert span == pytest.approx(2.0) and ghz == pytest.approx([2.0, 2.0])
    assert "scores: start -> QK(0) done (us)" not in q and "scores: per tile after the first (cycles)" not in q
    assert q["scores: start -> Q stored (us)"] == pytest.approx([0.5])


def test_a_malformed_line_is_an_error_not_a_silent_figure():
    with pytest.raises(ValueError, match="PHASES line with 9 fields"):
        wp.parse(["CALL 1 1 0", "PHASES 0 0 0 1 6 100 200 5"])


def test_the_arguments_are_checked():
    for bad in (["--shapes", "64x1024"], ["--shapes", "0:1024"], ["--heads", "16"], ["--calls", "0"],
                ["--format", "fp4"]):
        with pytest.raises(SystemExit):
            wp.parse_args(bad)
    a = wp.parse_args(["--shapes", "64:1024,4:8192", "--format", "mxfp4", "--calls", "3"])
    assert a.shapes == [(64, 1024), (4, 8192)] and a.format == "mxfp4" and a.calls == 3


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU-only message")
def test_without_a_gpu_it_says_so():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "wide_phases.py")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode != 0 and "needs a CUDA device" in res.stderr


@pytest.mark.skipif(not __import__("mla_decode")._ops.native_available(), reason="needs the native library")
def test_the_child_runs_its_calls_on_the_cpu(capsys):
    # The child's calls and their CALL / PLAN lines, on the CPU kernel (no probes there).
    wp.child("bf16", [(2, 70)], 128, 2, device="cpu")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "DEVICE cpu"
    assert out[1].startswith("PLAN 2 70 ")
    assert [ln for ln in out if ln.startswith("CALL")] == ["CALL 2 70 0", "CALL 2 70 1"]
    assert out[-1] == "END" and not any(ln.startswith("PHASES") for ln in out)
