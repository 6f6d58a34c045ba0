"""The competition's timing protocol, shared by the benchmark, the demo and the
tuning scripts: per timed call, synchronise, flush L2 by writing a buffer much
larger than it, record an event, make the call, record an event, synchronise.
On the CPU: perf_counter around each call, no flush."""

from __future__ import annotations

import time

import torch

FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2


class L2Flusher:
    """Writes a buffer much larger than L2 before each timed call (GPU only)."""

    def __init__(self, device: torch.device, nbytes: int = FLUSH_BYTES):
        self.device = device
        self.nbytes = nbytes if device.type == "cuda" else 0
        self.buf = torch.empty(self.nbytes, dtype=torch.int8, device=device) if self.nbytes else None

    def flush(self):
        if self.buf is not None:
            self.buf.zero_()


def time_protocol(fn, n_iters: int, n_warmup: int, flusher: L2Flusher, device: torch.device) -> list:
    """fn(i) for i < n_warmup untimed, then n_iters timed calls fn(i); returns microseconds."""
    for i in range(n_warmup):
        fn(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_iters)]
        for i in range(n_iters):
            torch.cuda.synchronize()
            flusher.flush()
            starts[i].record()
            fn(i)
            ends[i].record()
            torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    out = []
    for i in range(n_iters):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out
