"""The competition's timing protocol, shared by the benchmark, the demo and the
tuning scripts: per timed call, synchronise, flush L2, record an event, make
the call, record an event, synchronise. On the CPU: perf_counter around each
call, no flush.

The flush is the competition harness's: a buffer much larger than L2 (at
least 4x L2 and at least 1 GiB) rewritten with random numbers before every
timed call. So every timed call starts with L2 full of dirty lines of that
buffer, whose write-back it pays, as in the ranked runs.
"""

from __future__ import annotations

import time

import torch

MIN_FLUSH_BYTES = 2**30


def flush_bytes_for(device: torch.device) -> int:
    """max(1 GiB, 4 x L2) on a GPU (L2 size from the device's properties), 0 on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    return max(MIN_FLUSH_BYTES, 4 * l2)


class L2Flusher:
    """Rewrites a buffer much larger than L2 with random numbers (torch.Tensor.normal_) before
    each timed call (GPU only; flush() is a no-op on the CPU).

    nbytes: the buffer's size (default flush_bytes_for(device): at least 4x L2 and 1 GiB)."""

    def __init__(self, device: torch.device, nbytes: int | None = None):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            self.nbytes = 0
        else:
            self.nbytes = flush_bytes_for(self.device) if nbytes is None else int(nbytes)
            if self.nbytes <= 0:
                raise ValueError(f"L2Flusher: nbytes must be positive on a GPU, got {nbytes}")
        self.buf = (torch.empty(self.nbytes // 4, dtype=torch.float32, device=self.device)
                    if self.nbytes else None)

    def flush(self):
        if self.buf is not None:
            self.buf.normal_()


def time_protocol(fn, n_iters: int, n_warmup: int, flusher: L2Flusher, device: torch.device) -> list:
    """fn(i) for i < n_warmup untimed, then n_iters timed calls fn(i); returns microseconds."""
    return time_rounds({"fn": fn}, n_iters, n_warmup, flusher, device)["fn"]


def time_rounds(fns: dict, n_iters: int, n_warmup: int, flusher: L2Flusher, device: torch.device,
                before=None, on_error=None) -> dict:
    """The protocol for several providers, interleaved: n_warmup untimed calls of each, then
    n_iters rounds, each timing every provider once, in order (so all see the same GPU state).

    fns: name -> fn(i). before(name, i), if given, runs untimed before that call's flush (e.g. to
    set what the call reads). A provider whose call raises is dropped from later rounds;
    on_error(name, exc) is told (by default the exception propagates). Returns name -> list of
    microseconds (shorter for a dropped provider)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    live = dict(fns)
    times = {name: [] for name in fns}

    def guarded(name, i, timed):
        try:
            if before is not None:
                before(name, i)
            if not timed:
                live[name](i)
                return None
            if cuda:
                torch.cuda.synchronize()
                flusher.flush()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                live[name](i)
                end.record()
                torch.cuda.synchronize()
                return start.elapsed_time(end) * 1e3
            t0 = time.perf_counter()
            live[name](i)
            return (time.perf_counter() - t0) * 1e6
        except Exception as exc:  # noqa: BLE001
            if on_error is None:
                raise
            on_error(name, exc)
            live.pop(name, None)
            return None

    for name in list(live):
        for i in range(n_warmup):
            if name in live:
                guarded(name, i, False)
    if cuda:
        torch.cuda.synchronize()
    for i in range(n_iters):
        for name in list(live):
            t = guarded(name, i, True)
            if t is not None:
                times[name].append(t)
    return times
