"""Kernel timeline of whole calls replayed in CUDA graphs: how long each kernel runs, and how
consecutive kernels and calls overlap, back to back and alone.

    python3 scripts/kernel_timeline.py [--providers mla_decode,flash_mla] [--shapes 64:1024,32:8192]
                                       [--heads 128] [--format bf16]

For each provider and shape (q_len 1, the H = 128 sweep's inputs and rotation over copies worth
3x L2), three graphs, captured as the benchmark's WindowTimer captures them, are replayed under
the PyTorch profiler (CUPTI kernel records, which carry each kernel's GPU start and end also
inside a graph):

  n=16   at least 16 calls back to back, every rotated set alike, 4 replays 50 ms apart
  n=1    one call, 8 replays 50 ms apart (the call alone after an idle gap)
  +prod  as n=16, each call preceded by a kernel that writes the call's Q (q *= 1, same values), as a
         model's projection or RoPE does before attention

and per graph it prints each kernel's median / min / max duration, the median gap between
consecutive kernels (start of the next minus end of the previous; negative: they overlap) and
the median period between the starts of the first kernel of consecutive calls, plus the
event-timed length of a replay (which includes the graph's launch and, after the idle gap, the
clock's ramp: read the kernel records for the kernels' own time).

`flash_mla` is the benchmark's FlashMLA peer (mla_decode.bench.providers.FlashMLAPeer): it needs
the `flash_mla` module on PYTHONPATH; this script neither holds nor builds its code.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

IDLE_GAP_US = 200.0  # a gap longer than this between two kernel records separates two replays


def short_name(name: str) -> str:
    """A kernel's record name reduced to what tells the kernels of one call apart."""
    for key in ("flash_fwd_splitkv_mla_kernel", "combine", "wide", "narrow", "split", "merge", "elementwise"):
        if key in name:
            return key
    return name.replace("void ", "")[:50]


def summarize(records):
    """records: [(name, start_us, duration_us)] in any order. Returns
    (durations {short name: [us]}, gaps {"a->b": [us]}, periods [us]): gaps between consecutive
    records (by start) of one replay, periods between the starts of consecutive records named like
    the first record."""
    ks = sorted(records, key=lambda r: r[1])
    durations = {}
    for n, _, d in ks:
        durations.setdefault(short_name(n), []).append(d)
    gaps = {}
    for (n0, t0, d0), (n1, t1, _) in zip(ks, ks[1:]):
        g = t1 - (t0 + d0)
        if g > IDLE_GAP_US:
            continue
        gaps.setdefault(f"{short_name(n0)}->{short_name(n1)}", []).append(g)
    periods = []
    if ks:
        first = short_name(ks[0][0])
        starts = [t for n, t, _ in ks if short_name(n) == first]
        limit = IDLE_GAP_US + 10 * max(durations[first])
        periods = [b - a for a, b in zip(starts, starts[1:]) if b - a < limit]
    return durations, gaps, periods


def format_summary(label, records) -> str:
    if not records:
        return f"  {label}: no kernel records"
    durations, gaps, periods = summarize(records)
    med = statistics.median
    lines = [f"  {label}: " + "; ".join(f"{k} n={len(v)} med {med(v):.2f} min {min(v):.2f} max {max(v):.2f}"
                                        for k, v in durations.items())]
    lines.append("     gaps: " + "; ".join(f"{k} med {med(v):.2f} min {min(v):.2f}" for k, v in gaps.items()))
    if periods:
        lines.append(f"     period: med {med(periods):.2f} min {min(periods):.2f}")
    return "\n".join(lines)


def kernel_records(prof):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return [(e["name"], float(e["ts"]), float(e["dur"])) for e in trace["traceEvents"]
            if e.get("cat") == "kernel" and e.get("ph") == "X"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--providers", default="mla_decode,flash_mla")
    ap.add_argument("--shapes", default="64:1024,32:8192,4:8192", help="B:kv,...")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--format", default="bf16", choices=["bf16", "fp8", "mxfp4"])
    args = ap.parse_args(argv)
    args.providers = [p for p in args.providers.split(",") if p]
    for p in args.providers:
        if p not in ("mla_decode", "flash_mla"):
            ap.error(f"--providers: expected mla_decode and/or flash_mla, got {p!r}")
    if "flash_mla" in args.providers and args.format != "bf16":
        ap.error(f"--providers flash_mla: FlashMLA's dense decode reads a bf16 cache, got --format {args.format}")
    try:
        args.shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",") if s]
        if any(len(s) != 2 or min(s) < 1 for s in args.shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes: expected B:kv pairs of positive integers, got {args.shapes!r}")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        sys.exit("kernel_timeline.py: needs a CUDA device (CUPTI kernel records of graph replays)")
    from torch.profiler import ProfilerActivity, profile

    import mla_decode
    from mla_decode.bench.metrics import KV_BYTES_PER_TOKEN
    from mla_decode.bench.providers import FlashMLAPeer, cache_of
    from mla_decode.bench.sections import rotated_sets
    from mla_decode.bench.timers import WindowTimer
    from mla_decode.inputs import generate_input

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    peer = None
    if "flash_mla" in args.providers:
        peer = FlashMLAPeer()
        peer.probe(dev)
        if not peer.available:
            print(f"flash_mla: not available ({peer.reason}); timing mla_decode only", flush=True)
            peer = None
    print(torch.cuda.get_device_name(dev), flush=True)
    for b, kv in args.shapes:
        q, kv_data, qo, kvp, cfg = generate_input(b, 1, kv, seed=3, device=dev, num_heads=args.heads)
        cache, scale = cache_of(kv_data, args.format)
        sm = float(cfg["sm_scale"])
        set_bytes = b * kv * KV_BYTES_PER_TOKEN[args.format] + q.numel() * q.element_size()
        sets = rotated_sets(q, cache, scale, set_bytes, l2)
        provs = {}
        if "mla_decode" in args.providers:
            provs["mla_decode"] = [(lambda qq=qq, kk=kk, ss=ss: mla_decode.decode(qq, kk, qo, kv_scale=ss, kv_indptr=kvp,
                                                                                  sm_scale=sm)) for qq, kk, ss in sets]
        if peer is not None:
            states = peer.prepare([(qq, kk) for qq, kk, _ in sets], qo, kvp, cfg)
            provs["flash_mla"] = [(lambda st=st: peer.call(st)) for st in states]
        for name in list(provs):
            provs[name + "+prod"] = [(lambda c=c, qq=qq: (qq.mul_(1.0), c())) for c, (qq, _, _) in zip(provs[name], sets)]
        for name, calls in provs.items():
            for n, reps in ((16, 4),) if name.endswith("+prod") else ((16, 4), (1, 8)):
                # The benchmark's graph: at least n calls, every rotated set alike (n = 1: one call).
                timer = WindowTimer(calls if n > 1 else calls[:1], dev, n)
                for _ in range(3):
                    timer.window()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(reps):
                        time.sleep(0.05)
                        timer.window()
                per_call = []
                for _ in range(reps):
                    time.sleep(0.05)
                    per_call.append(timer.window()[0])
                us = statistics.median(per_call)
                print(f"{name} {b}x{kv} graph of {timer.per_graph} calls ({len(sets)} sets, {timer.method}): "
                      f"replay {us * timer.per_graph:.1f} us = {us:.2f} per call", flush=True)
                print(format_summary(f"{name} {b}x{kv} n={timer.per_graph}", kernel_records(prof)), flush=True)
                timer.close()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
