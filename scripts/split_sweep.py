"""Time of the decode operator for forced split counts (the num_splits argument), to tune the
plan (csrc/plan).

Two methods:
  default   the competition protocol (L2 flushed before each timed call, the whole call timed),
            the split counts of one shape interleaved call by call (mla_decode.timing.time_rounds),
            --calls rounds; the mean of each count's calls without its two fastest and two slowest;
  --graph   the H = 128 sweep's method (mla_decode.bench): the calls captured in a CUDA graph
            rotating over input copies worth 3x L2, replayed in short windows (--window-ms of GPU
            work) after idle gaps, median of --windows windows. The split counts of one shape run
            interleaved window by window, so a change of the GPU's state reaches all of them;
            with --peer, FlashMLA's dense decode (bf16, when `import flash_mla` works) runs in the
            same rotation as a reference.

Usage: python scripts/split_sweep.py [fmt ...] [--shapes B:KV,B:KV,...] [--heads H] [--q-len N]
           [--splits 0,2,4,...] [--calls N] [--graph [--windows N] [--window-ms MS] [--gap-s S] [--peer]
           [--kernels K,...]]
Split 0 is the plan's own choice. Prints one line per format and shape: splits:time (us)."""
import argparse
import statistics
import time

import torch

import mla_decode  # noqa: F401
from mla_decode.bench.providers import cache_of
from mla_decode.bench.sections import rotated_sets
from mla_decode.inputs import generate_input
from mla_decode.timing import L2Flusher, time_rounds

DEFAULT_SPLITS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("formats", nargs="*", default=["bf16", "fp8"])
    ap.add_argument("--shapes", default="4:1024,4:8192,32:1024,64:1024,32:8192,256:1024",
                    help="comma list of B:KV")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--q-len", type=int, default=1, help="query tokens per item (MTP: 2)")
    ap.add_argument("--splits", default=",".join(map(str, DEFAULT_SPLITS)), help="comma list; 0 = the plan's")
    ap.add_argument("--graph", action="store_true", help="CUDA-graph windows (the H = 128 sweep's method)")
    ap.add_argument("--calls", type=int, default=20, help="protocol: timed rounds (default 20)")
    ap.add_argument("--windows", type=int, default=7)
    ap.add_argument("--window-ms", type=float, default=15.0)
    ap.add_argument("--gap-s", type=float, default=0.1)
    ap.add_argument("--peer", action="store_true", help="with --graph: FlashMLA (bf16) in the same rotation")
    ap.add_argument("--kernels", default="", help="with --graph: comma list of kernels to force (plan spelling, e.g. "
                    "wide,mma_sync), each with every split count; default the plan's choice")
    args = ap.parse_args(argv)
    args.shapes = [tuple(int(x) for x in sh.split(":")) for sh in args.shapes.split(",")]
    args.splits = [int(s) for s in args.splits.split(",")]
    return args


def protocol_line(fmt, b, kv, heads, splits, calls, flusher, dev, q_len=1):
    q, kvd, qo, kvp, cfg = generate_input(b, q_len, kv, seed=3, device=dev, num_heads=heads)
    cache, scale = cache_of(kvd, fmt)
    fns = {ns: (lambda i, ns=ns: torch.ops.mla_decode.decode(q, cache, scale, qo, kvp, None, None, None, 1,
                                                             cfg["sm_scale"], ns))
           for ns in splits if ns * 32 <= kv}
    times = time_rounds(fns, calls, 3, flusher, dev)
    res = []
    for ns, ts in times.items():
        ts = sorted(ts)
        kept = ts[2:-2] if len(ts) > 4 else ts
        res.append(f"{ns}:{sum(kept) / len(kept):.1f}")
    return " ".join(res)


def graph_line(fmt, b, kv, heads, args, peer):
    from mla_decode.bench.timers import WindowTimer
    dev = torch.device("cuda")
    q, kvd, qo, kvp, cfg = generate_input(b, args.q_len, kv, seed=3, device=dev, num_heads=heads)
    cache, scale = cache_of(kvd, fmt)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    set_bytes = cache.numel() * cache.element_size() + q.numel() * q.element_size()
    sets = rotated_sets(q, cache, scale, set_bytes, l2)
    sm = float(cfg["sm_scale"])
    timers = {}
    kernels = [k for k in args.kernels.split(",") if k] or [None]
    for kernel in kernels:
        for ns in args.splits:
            if ns * 32 > kv:
                continue
            ov = None if kernel is None else {"kernel": kernel}
            calls = [(lambda qq=qq, kk=kk, ss=ss, ns=ns, ov=ov: mla_decode.decode(
                qq, kk, qo, kv_scale=ss, kv_indptr=kvp, sm_scale=sm, num_splits=ns, _overrides=ov)) for qq, kk, ss in sets]
            label = str(ns) if kernel is None else f"{kernel}/{ns}"
            try:
                timers[label] = WindowTimer(calls, dev, 16)
            except RuntimeError as exc:  # a forced kernel that cannot run the call
                print(f"  {label}: {str(exc).splitlines()[0][:160]}")
    if peer is not None and fmt == "bf16":
        states = peer.prepare([(qq, kk) for qq, kk, _ in sets], qo, kvp, cfg)
        timers["flash_mla"] = WindowTimer([(lambda st=st: peer.call(st)) for st in states], dev, 16)
    for t in timers.values():
        t.calibrate(args.window_ms / 1000)
    times = {k: [] for k in timers}
    for _ in range(args.windows):
        for k, t in timers.items():
            time.sleep(args.gap_s)
            times[k].append(t.window()[0])
    for t in timers.values():
        t.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    best = min((v, k) for k, v in med.items() if k != "flash_mla")
    line = " ".join(f"{k}:{v:.2f}" for k, v in med.items())
    note = f"  best {best[1]} ({best[0]:.2f})"
    if "flash_mla" in med:
        note += f", best/flash_mla {best[0] / med['flash_mla']:.3f}"
        if "0" in med:
            note += f", plan/flash_mla {med['0'] / med['flash_mla']:.3f}"
    return line + note


def main(argv=None):
    args = parse_args(argv)
    # The protocol runs on the CPU too (no flush there), which is how the script is tested.
    dev = torch.device("cuda" if torch.cuda.is_available() or args.graph else "cpu")
    peer = None
    if args.graph and args.peer:
        from mla_decode.bench.providers import FlashMLAPeer
        peer = FlashMLAPeer()
        peer.probe(dev)
        if not peer.available:
            print(f"flash_mla: {peer.reason}")
            peer = None
    flusher = None if args.graph else L2Flusher(dev)
    for fmt in args.formats:
        for b, kv in args.shapes:
            line = (graph_line(fmt, b, kv, args.heads, args, peer) if args.graph
                    else protocol_line(fmt, b, kv, args.heads, args.splits, args.calls, flusher, dev, args.q_len))
            heads = f"H={args.heads}" + (f" q_len={args.q_len}" if args.q_len != 1 else "")
            print(fmt, b, kv, heads, "graph" if args.graph else "protocol", line, flush=True)


if __name__ == "__main__":
    main()
