"""Where the time of one competition call goes: GPU kernel durations and the
timeline of one call (CUPTI, via torch.profiler), and the host's cost of one
custom_kernel call, per shape.

    python3 scripts/kernel_times.py [fp8|bf16|mxfp4 ...]

For each competition shape: the mean device duration of each kernel of a call
(L2 flushed before every call, as in the protocol), the median timeline of a
call relative to the end of the flush kernel (when the protocol's start event
fires): split kernel start / end, combine end; and the host time of the call
(perf_counter around custom_kernel, no synchronisation; under the protocol it
is hidden behind the flush kernel). The combine kernel is launched early
(programmatic dependent launch) and waits, so its own duration is not its
cost: "comb_end - split_end" is. Prints one table per format.
"""
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mla_decode.competition import custom_kernel  # noqa: E402
from mla_decode.inputs import generate_input  # noqa: E402

SHAPES = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]
ITERS = 20


def main():
    formats = sys.argv[1:] or ["fp8", "bf16", "mxfp4"]
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    for fmt in formats:
        os.environ["MLA_DECODE_FORMAT"] = fmt
        print(f"== {fmt}: kernel durations (us, mean of {ITERS} flushed calls) and host us per call")
        for b, kv in SHAPES:
            data = generate_input(b, 1, kv, seed=3, device="cuda", num_heads=16)
            for _ in range(3):
                custom_kernel(data)
            torch.cuda.synchronize()
            host = []
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(ITERS):
                    flush.fill_(1)
                    t0 = time.perf_counter()
                    custom_kernel(data)
                    host.append((time.perf_counter() - t0) * 1e6)
                    torch.cuda.synchronize()
            per_kernel = defaultdict(float)
            marks = defaultdict(list)  # per call: flush end, split start/end, combine end
            for ev in prof.events():
                if ev.device_type != torch.autograd.DeviceType.CUDA:
                    continue
                name = ev.name.lower()
                # The split kernel: the mma.sync one, or the Hopper wide / narrow / register-V ones.
                is_split = any(k in name for k in ("split_kernel", "decode_narrow", "decode_wide", "wgmma_kernel"))
                kind = "flush" if "fill" in name else ("split" if is_split else
                                                       ("combine" if "combine" in name else name[:40]))
                marks[kind].append((ev.time_range.start, ev.time_range.end))
                if kind != "flush":
                    per_kernel[kind] += ev.device_time_total / ITERS
            line = ""
            if len(marks["flush"]) == ITERS and len(marks["split"]) == ITERS:
                fl, sp = sorted(marks["flush"]), sorted(marks["split"])
                co = sorted(marks["combine"]) if len(marks["combine"]) == ITERS else None
                med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
                line = (f"split {med([s[0] - f[1] for f, s in zip(fl, sp)]):5.1f}..{med([s[1] - f[1] for f, s in zip(fl, sp)]):6.1f}")
                if co:
                    line += f"  comb_end {med([c[1] - f[1] for f, c in zip(fl, co)]):6.1f}"
            parts = " ".join(f"{k}={v:.1f}" for k, v in sorted(per_kernel.items()))
            print(f"b{b:<4d} kv{kv:<5d} {line:34s} durations: {parts}  host={sorted(host)[len(host) // 2]:.1f}")


if __name__ == "__main__":
    main()
