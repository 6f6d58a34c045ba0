"""Timers of the H = 128 sweep and the GPU clock / power monitor.

A sustained stream of kernels drives an H200 into its power cap (nvidia-smi
throttle reason 0x4, SW power cap) within a fraction of a second and lowers
its SM clock (docs/performance.md has the measurement), so a benchmark that
times long back-to-back windows measures the capped clock. The sweep therefore times
each provider as several short windows (a CUDA graph replayed for about
--window-ms of GPU work), each after an idle gap (--gap-s) so that every
window starts from the same power state, and reports the median window;
--sustained times back-to-back windows instead. The monitor records what
the clock and power did during each row's windows.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import signal
import subprocess
import threading
import time

import torch


class WindowTimer:
    """Per-call time of `calls` (zero-argument callables, one per rotated input set, called in
    turn), one window at a time.

    On CUDA the calls are captured in one CUDA graph holding at least `min_calls` calls (every
    set the same number of times); a window replays it n times between two events, n chosen by
    calibrate() so a window is about `window_s` of GPU work. If the capture fails, a window is
    an eager loop of the calls between two events (`method` says which). On the CPU a window is
    an eager loop timed with perf_counter."""

    def __init__(self, calls, device: torch.device, min_calls: int = 16):
        self.calls = list(calls)
        self.device = device
        # A graph holds at least min_calls calls (replay overhead amortised); an eager window on the
        # CPU is a multiple of the sets.
        reps = max(1, -(-min_calls // len(self.calls))) if device.type == "cuda" else 1
        self.per_graph = reps * len(self.calls)
        self.graph = None
        self.method = "eager-loop(cpu)"
        self.capture_error = ""
        self.n_rep = 1
        if device.type != "cuda":
            return
        # Warm up on a side stream (what capture expects), then capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in self.calls:
                c()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                for _ in range(reps):
                    for c in self.calls:
                        c()
            torch.cuda.synchronize()
            self.graph = g
            self.method = "cuda-graph"
        except Exception as exc:  # noqa: BLE001 - timed eagerly instead, and the row says so
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
            self.capture_error = f"{type(exc).__name__}: {str(exc)[:120]}"
            self.method = "eager-loop(capture failed)"

    def _run(self, n: int) -> None:
        if self.graph is not None:
            for _ in range(n):
                self.graph.replay()
        else:
            for i in range(n * self.per_graph):
                self.calls[i % len(self.calls)]()

    def calibrate(self, window_s: float) -> None:
        """Chooses n (graph replays, or rounds of per_graph eager calls) per window."""
        self._run(1)
        self._sync()
        t0 = time.perf_counter()
        self._run(1)
        self._sync()
        one = max(time.perf_counter() - t0, 1e-7)
        self.n_rep = int(min(max(round(window_s / one), 1), 100000))

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    @property
    def calls_per_window(self) -> int:
        return self.n_rep * self.per_graph

    def window(self) -> tuple:
        """One window: (microseconds per call, host time.time() at its start, at its end)."""
        w0 = time.time()
        if self.device.type == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            self._run(self.n_rep)
            b.record()
            torch.cuda.synchronize()
            us = a.elapsed_time(b) * 1e3 / self.calls_per_window
        else:
            t0 = time.perf_counter()
            self._run(self.n_rep)
            us = (time.perf_counter() - t0) * 1e6 / self.calls_per_window
        return us, w0, time.time()

    def close(self):
        self.graph = None
        self.calls = []


# --------------------------------------------------------------------------------------------
# nvidia-smi monitor
# --------------------------------------------------------------------------------------------

QUERY_FIELDS = ("timestamp", "clocks.sm", "power.draw", "clocks_throttle_reasons.active")
# Newer drivers also name the throttle reasons "clocks_event_reasons".
QUERY_FIELDS_NEW = ("timestamp", "clocks.sm", "power.draw", "clocks_event_reasons.active")


def _num(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi_line(line: str, received: float):
    """One CSV line of the query -> {"t", "sm_mhz", "power_w", "throttle"} (None when not a sample).
    "t" is the line's own timestamp (local time) when it parses, else when it was read."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != 4:
        return None
    stamp, mhz, watts, reasons = parts
    t = received
    try:
        t = _dt.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        pass
    try:
        throttle = int(reasons, 16)
    except ValueError:
        throttle = None
    sample = {"t": t, "sm_mhz": _num(mhz), "power_w": _num(watts), "throttle": throttle}
    if sample["sm_mhz"] is None and sample["power_w"] is None:
        return None
    return sample


class GpuMonitor:
    """Samples the GPU's SM clock, power draw and throttle reasons with nvidia-smi in a
    background loop (start() .. stop()); annotate(row, intervals) adds to a row what happened
    during its windows. Quietly does nothing without nvidia-smi, without CUDA, or when the query
    fails (`reason` says why)."""

    def __init__(self, device: torch.device, period_ms: int = 25, exe: str | None = None):
        self.samples = []
        self.available = False
        self.reason = ""
        self.period_ms = period_ms
        self._proc = None
        self._thread = None
        self.fields = QUERY_FIELDS
        self.exe = exe or shutil.which("nvidia-smi")
        if device.type != "cuda" or torch.version.cuda is None:
            self.reason = "not an NVIDIA GPU"
            return
        if self.exe is None:
            self.reason = "nvidia-smi not found"
            return
        self.ident = ""
        for self.ident in self._identities(device):
            for fields in (QUERY_FIELDS, QUERY_FIELDS_NEW):
                self.fields = fields
                if self.sample_once() is not None:
                    self.available = True
                    return
        self.reason = "the nvidia-smi query failed"

    @staticmethod
    def _identities(device: torch.device) -> list:
        """How nvidia-smi -i may name this GPU: its UUID; its index when CUDA_VISIBLE_DEVICES does
        not renumber the GPUs."""
        out = []
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            if uuid:
                out.append(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception:  # noqa: BLE001
            pass
        if not os.environ.get("CUDA_VISIBLE_DEVICES"):
            out.append(str(device.index if device.index is not None else torch.cuda.current_device()))
        return out

    def _cmd(self, loop: bool):
        cmd = [self.exe, "--query-gpu=" + ",".join(self.fields), "--format=csv,noheader,nounits", "-i", self.ident]
        if not loop:
            return cmd
        # Line-buffered output when stdbuf is there (each line carries its own timestamp anyway).
        return (["stdbuf", "-oL"] if shutil.which("stdbuf") else []) + cmd + ["-lms", str(self.period_ms)]

    def sample_once(self):
        try:
            res = subprocess.run(self._cmd(False), capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        if res.returncode != 0:
            return None
        for line in res.stdout.splitlines():
            s = parse_smi_line(line, time.time())
            if s is not None:
                return s
        return None

    def start(self):
        if not self.available or self._proc is not None:
            return
        try:
            self._proc = subprocess.Popen(self._cmd(True), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True, bufsize=1)
        except OSError as exc:
            self.available, self.reason = False, f"nvidia-smi did not start ({exc})"
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._proc.stdout:
            s = parse_smi_line(line, time.time())
            if s is not None:
                self.samples.append(s)

    def stop(self):
        if self._proc is None:
            return
        # SIGINT first: nvidia-smi leaves its loop and exits normally, writing what it holds.
        for stop in (lambda: self._proc.send_signal(signal.SIGINT), self._proc.terminate, self._proc.kill):
            stop()
            try:
                self._proc.wait(timeout=3)
                break
            except subprocess.TimeoutExpired:
                continue
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._proc = self._thread = None

    def annotate(self, row: dict, intervals, slack_s: float = 0.03) -> None:
        """Adds sm_mhz_before / power_w_before (the last sample before the first interval),
        sm_mhz_during (median) / sm_mhz_min / power_w_max / throttle (OR of the reasons, hex) over
        the samples inside the intervals (each widened by slack_s: a sample every period_ms), and
        smi_samples (how many)."""
        if not self.samples or not intervals:
            return
        first = min(t0 for t0, _ in intervals)
        before = [s for s in self.samples if s["t"] < first]
        if before:
            row["sm_mhz_before"] = before[-1]["sm_mhz"]
            row["power_w_before"] = before[-1]["power_w"]
        inside = [s for s in self.samples if any(t0 <= s["t"] <= t1 + slack_s for t0, t1 in intervals)]
        row["smi_samples"] = len(inside)
        mhz = sorted(s["sm_mhz"] for s in inside if s["sm_mhz"] is not None)
        watts = [s["power_w"] for s in inside if s["power_w"] is not None]
        reasons = [s["throttle"] for s in inside if s["throttle"] is not None]
        if mhz:
            row["sm_mhz_during"] = mhz[len(mhz) // 2]
            row["sm_mhz_min"] = mhz[0]
        if watts:
            row["power_w_max"] = max(watts)
        if reasons:
            acc = 0
            for r in reasons:
                acc |= r
            row["throttle"] = hex(acc)


class NullMonitor:
    """GpuMonitor's interface, doing nothing (no nvidia-smi, or --no-smi)."""

    available = False

    def __init__(self, reason: str = ""):
        self.reason = reason
        self.samples = []

    def start(self):
        pass

    def stop(self):
        pass

    def annotate(self, row, intervals, slack_s=0.03):
        pass
