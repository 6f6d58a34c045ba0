"""Where the time of one competition call goes: GPU kernel durations (CUPTI, via
torch.profiler) and the host's cost of one custom_kernel call, per shape.

    python3 scripts/kernel_times.py [fp8|bf16|mxfp4 ...]

For each competition shape: the mean device duration of each kernel of a call
(L2 flushed before every call, as in the protocol), their sum, and the host
time of the call (perf_counter around custom_kernel, no synchronisation; under
the protocol it is hidden behind the flush kernel). Prints one table per format.
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
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA and "fill" not in ev.name.lower():
                    name = "split" if "split_kernel" in ev.name else ("combine" if "combine" in ev.name else ev.name[:40])
                    per_kernel[name] += ev.device_time_total / ITERS
            parts = " ".join(f"{k}={v:.1f}" for k, v in sorted(per_kernel.items()))
            print(f"b{b:<4d} kv{kv:<5d} sum={sum(per_kernel.values()):6.1f}  {parts}  host={sorted(host)[len(host) // 2]:.1f}")


if __name__ == "__main__":
    main()
