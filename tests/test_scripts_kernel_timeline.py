"""scripts/kernel_timeline.py (kernel records of graph-replayed calls): its summary of the records
(durations, gaps between consecutive kernels, periods between calls) on synthetic timelines, and
its argument checks. The timing itself needs a CUDA device."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("kernel_timeline", ROOT / "scripts" / "kernel_timeline.py")
kt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kt)

MAIN = "void flash::flash_fwd_splitkv_mla_kernel<Traits>(Params)"
COMBINE = "void smxx::decode::flash_fwd_mla_combine_kernel<bf16>(CombineParams)"


def test_overlapping_calls_give_negative_gaps_and_the_call_period():
    # Two replays 1 ms apart, each of three calls: main 40 us, the combine starting 2 us before
    # the main ends and lasting 3 us, the next main starting 0.5 us after the combine ends.
    recs = []
    for replay in range(2):
        t = 1000.0 * replay
        for _ in range(3):
            recs += [(MAIN, t, 40.0), (COMBINE, t + 38.0, 3.0)]
            t += 41.5
    durations, gaps, periods = kt.summarize(list(reversed(recs)))  # any order in
    assert durations == {"flash_fwd_splitkv_mla_kernel": [40.0] * 6, "combine": [3.0] * 6}
    assert gaps["flash_fwd_splitkv_mla_kernel->combine"] == [-2.0] * 6
    # the idle gap between the replays is not a gap between calls
    assert gaps["combine->flash_fwd_splitkv_mla_kernel"] == [0.5] * 4
    assert periods == [41.5] * 4


def test_no_records_is_said():
    assert "no kernel records" in kt.format_summary("x", [])


def test_the_arguments_are_checked():
    with pytest.raises(SystemExit):
        kt.parse_args(["--shapes", "64x1024"])
    with pytest.raises(SystemExit):
        kt.parse_args(["--providers", "flashinfer"])
    with pytest.raises(SystemExit):
        kt.parse_args(["--providers", "flash_mla", "--format", "fp8"])
    a = kt.parse_args(["--shapes", "64:1024,4:8192", "--providers", "mla_decode", "--format", "mxfp4"])
    assert a.shapes == [(64, 1024), (4, 8192)] and a.providers == ["mla_decode"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU-only message")
def test_without_a_gpu_it_says_so():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_timeline.py")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode != 0 and "needs a CUDA device" in res.stderr
