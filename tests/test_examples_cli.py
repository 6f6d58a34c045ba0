"""The examples, the command line and the benchmark run end to end (CPU here, GPU on a GPU
machine); the benchmark's timers and monitor work without a GPU."""

import csv
import os
import stat
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=600, cwd=ROOT):
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


def test_deepseek_decode_step_example():
    out = run("examples/deepseek_decode_step.py")
    assert "all checks passed" in out and "FAIL" not in out


def test_quickstart_example():
    out = run("examples/quickstart.py")
    assert "custom_kernel rel. error" in out and "mxfp4 rel. error" in out


def test_cli_info_and_check():
    assert '"native": true' in run("-m", "mla_decode", "info")
    out = run("-m", "mla_decode", "check")
    assert "checks passed, 0 failed" in out and " op  mxfp4    paged" in out and "custom_kernel fp8" in out


def test_bench_help_lists_every_flag():
    """`python -m mla_decode bench --help` and the repository script list the same, complete set."""
    from mla_decode.bench import parse_args
    import argparse
    from mla_decode.bench import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = {s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    assert len(flags) > 25
    for text in (run("-m", "mla_decode", "bench", "--help"), run("benchmarks/bench_decode.py", "--help")):
        missing = [f for f in flags if f not in text]
        assert not missing, missing
    assert parse_args(["--quick"]).windows == 3


def test_cli_bench_cpu_smoke_with_a_gpu_device_is_a_clear_error(tmp_path):
    """--cpu-smoke runs on the CPU whether or not a GPU is visible; asking for it on CUDA is refused."""
    res = subprocess.run([sys.executable, "-m", "mla_decode", "bench", "--cpu-smoke", "--device", "cuda", "--out",
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "--cpu-smoke runs on the CPU; it cannot be combined with --device cuda" in res.stdout + res.stderr


def test_cli_bench_smoke(tmp_path):
    out = run("-m", "mla_decode", "bench", "--quick", "--cpu-smoke", "--out", str(tmp_path))
    assert "SUMMARY" in out and "streaming floor: unavailable (needs CUDA)" in out
    with open(tmp_path / "competition.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["format"] for r in rows} == {"mxfp4", "fp8", "bf16"}
    for r in rows:
        own, exact = float(r["err_vs_own_cache"]), float(r["err_vs_bf16_exact"])
        assert own < 8e-3, r                       # the kernel's own error
        if r["format"] == "bf16":
            assert exact == own
        else:                                      # the format's quantisation error on top
            assert exact > 5 * own, r
        assert float(r["x_floor"]) > 1 and float(r["gbps_kv"]) > 0
    assert (tmp_path / "sweep_h128.csv").exists() and (tmp_path / "results.json").exists()


def test_cli_bench_sweep_q_len_2(tmp_path):
    """The MTP sweep (--sweep-q-len 2): its own CSV, rows with q_len 2, errors against float64 that
    apply the bottom-right causal mask (a wrong mask would show as a large error)."""
    out = run("-m", "mla_decode", "bench", "--quick", "--cpu-smoke", "--skip-competition", "--sweep-q-len", "2",
              "--out", str(tmp_path))
    assert "sweep H=128 q_len=2: geomean" in out
    with open(tmp_path / "sweep_h128_q2.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["provider"] == "mla_decode"]
    assert rows and all(r["q_len"] == "2" for r in rows)
    for r in rows:
        assert not r["error"] and float(r["err_vs_own_cache"]) < 8e-3, r


def test_time_rounds_interleaves_and_drops_a_failing_provider():
    from mla_decode.timing import L2Flusher, time_rounds
    order = []

    def ok(name):
        return lambda i: order.append((name, i))

    def bad(i):
        if i >= 2:
            raise RuntimeError("boom")

    errors = {}
    times = time_rounds({"a": ok("a"), "b": ok("b"), "bad": bad}, 3, 1, L2Flusher(torch.device("cpu")),
                        torch.device("cpu"), on_error=lambda n, e: errors.setdefault(n, str(e)))
    assert order == [("a", 0), ("b", 0), ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert len(times["a"]) == 3 and len(times["bad"]) == 2 and errors == {"bad": "boom"}


def test_flush_size():
    from mla_decode.timing import MIN_FLUSH_BYTES, L2Flusher, flush_bytes_for
    assert L2Flusher(torch.device("cpu")).nbytes == 0 and flush_bytes_for("cpu") == 0
    assert MIN_FLUSH_BYTES == 2**30
    if torch.cuda.is_available():
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        assert flush_bytes_for("cuda") == max(2**30, 4 * l2)


def test_gpu_monitor_with_a_stand_in_nvidia_smi(tmp_path):
    """The monitor's loop and row annotation, with a script that prints what nvidia-smi prints."""
    from mla_decode.bench.timers import GpuMonitor, parse_smi_line
    assert parse_smi_line("2026/01/02 03:04:05.250, 1980, 650.50, 0x0000000000000004", 0.0)["throttle"] == 4
    assert parse_smi_line("2026/01/02 03:04:05.250, 1500, [N/A], 0x0", 0.0)["power_w"] is None
    assert parse_smi_line("garbage", 0.0) is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/bash\n"
                    "line() { echo \"$(date +'%Y/%m/%d %H:%M:%S.%3N'), 1500, 699.90, 0x0000000000000004\"; }\n"
                    "case \"$*\" in *-lms*) while true; do line; sleep 0.02; done;; *) line;; esac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    mon = GpuMonitor.__new__(GpuMonitor)           # the CUDA probe aside: drive the sampler directly
    mon.samples, mon.available, mon.reason, mon.period_ms = [], True, "", 20
    mon._proc = mon._thread = None
    mon.exe, mon.ident = str(fake), "0"
    from mla_decode.bench.timers import QUERY_FIELDS
    mon.fields = QUERY_FIELDS
    assert mon.sample_once()["sm_mhz"] == 1500
    mon.start()
    t0 = time.time()
    time.sleep(0.5)
    t1 = time.time()
    mon.stop()
    row = {}
    mon.annotate(row, [(t0 + 0.1, t1 - 0.1)])
    assert row["smi_samples"] >= 3 and row["sm_mhz_min"] == 1500 and row["power_w_max"] == 699.9, row
    assert row["throttle"] == "0x4" and row["sm_mhz_before"] == 1500


def test_window_timer_on_the_cpu():
    from mla_decode.bench.timers import WindowTimer
    calls = []
    t = WindowTimer([lambda: calls.append(0), lambda: calls.append(1)], torch.device("cpu"), min_calls=16)
    t.calibrate(0.001)
    us, w0, w1 = t.window()
    assert us > 0 and w1 >= w0 and t.method == "eager-loop(cpu)" and t.calls_per_window % 2 == 0


def test_bench_sections_with_a_peer_and_a_floor_on_the_cpu():
    """The sections' GPU-only providers driven on the CPU: the FlashMLA adapter on
    mla_decode.flash_mla (its current interface) and a streaming floor that sums the bytes, so
    the interleaving, the peer and floor rows, x stream and both errors are exercised here."""
    from mla_decode import bench, flash_mla
    from mla_decode.bench import report, sections
    from mla_decode.bench.providers import FlashMLAPeer, StreamFloor
    from mla_decode.bench.timers import NullMonitor
    from mla_decode.timing import L2Flusher

    class SumFloor(StreamFloor):
        def __init__(self):
            self.available, self.reason, self.sink = True, "", None

        def call(self, buf):
            return buf.sum()

    class BrokenPeer(FlashMLAPeer):
        name = "broken"

        def call(self, st):
            raise RuntimeError("this peer always fails")

    peer = FlashMLAPeer()
    peer.mod, peer.api, peer.available = flash_mla, "current", True
    broken = BrokenPeer()
    broken.mod, broken.api, broken.available = flash_mla, "three-argument", True
    dev = torch.device("cpu")
    args = bench.parse_args(["--quick", "--iters", "3", "--seeds", "2"])
    ctx = bench._Context(dev, L2Flusher(dev), [peer, broken], SumFloor(), NullMonitor(), lambda m: None)
    comp, sweep = [], []
    sections.competition(args, ctx, comp)
    sections.sweep(args, ctx, sweep)
    for rows in (comp, sweep):            # a failing provider is an error row; the others go on
        (bad,) = [r for r in rows if r["provider"] == "broken"]
        assert "this peer always fails" in bad["error"]
        rows.remove(bad)
    labels = {report.label_of(r) for r in comp}
    assert labels == {"mxfp4", "fp8", "bf16", "flash_mla:bf16", "stream:mxfp4", "stream:fp8", "stream:bf16"}
    for r in comp:
        assert not r["error"] and r["n"] == 3, r
        assert r["x_stream"] is not None and (r["provider"] != "stream" or r["x_stream"] == 1.0)
        if r["provider"] != "stream":
            assert r["err_vs_own_cache"] < 8e-3, r
    peer_row = next(r for r in comp if r["provider"] == "flash_mla")
    assert peer_row["err_vs_bf16_exact"] == peer_row["err_vs_own_cache"] < 8e-3
    assert {report.label_of(r) for r in sweep} == {"mxfp4", "fp8", "bf16", "flash_mla:bf16"}
    assert all(not r["error"] and r["n"] == args.windows for r in sweep)
    summary = report.summarize(comp, 1)
    assert summary["fp8"]["x_stream"] is not None and summary["flash_mla:bf16"]["shapes"] == 1
