"""Where the time of one small competition call goes inside the kernels.

Needs a trace build (MLA_DECODE_TRACE=1 python3 setup.py build_ext --inplace;
csrc/kernels/common/trace.cuh): thread 0 of the corner CTAs of the split kernel and of
the combine kernel print %globaltimer stamps. This script runs the protocol's
call (L2 flushed, synchronised, one custom_kernel call) in a child process and
prints, per shape, the median over calls of each stamp in microseconds after
the first traced split CTA started:

    python3 scripts/trace_timeline.py [fp8|bf16|mxfp4] [--shapes 4:1024,4:8192]

Split stamps: start, lookup done (the indptr round trip), Q ready, tile 0
landed, tile loop done, outputs stored. Combine stamps: start, released by
griddepcontrol.wait, stored. The probes' printf delays the traced CTAs' exit by
a little, so the combine's release is an upper bound.
"""
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ITERS = 15


def child(fmt, shapes):
    import torch

    sys.path.insert(0, os.path.join(HERE, ".."))
    from mla_decode.competition import custom_kernel
    from mla_decode.inputs import generate_input
    from mla_decode.timing import L2Flusher

    os.environ["MLA_DECODE_FORMAT"] = fmt
    flusher = L2Flusher(torch.device("cuda"))
    for b, kv in shapes:
        data = generate_input(b, 1, kv, seed=3, device="cuda", num_heads=16)
        for _ in range(3):
            custom_kernel(data)
        torch.cuda.synchronize()
        for i in range(ITERS):
            flusher.flush()
            torch.cuda.synchronize()
            print(f"CALL {b} {kv} {i}", flush=True)
            custom_kernel(data)
            torch.cuda.synchronize()
        print("END", flush=True)


def parse(lines):
    calls = {}  # (b, kv) -> list of per-call stamp lists
    cur = None
    for ln in lines:
        f = ln.split()
        if not f:
            continue
        if f[0] == "CALL":
            cur = []
            calls.setdefault((int(f[1]), int(f[2])), []).append(cur)
        elif f[0] == "TRACE" and cur is not None:
            t0 = int(f[4])
            rel = [int(x) for x in f[5:] if int(x) >= 0]
            cur.append((f[1], int(f[2]), int(f[3]), t0, rel))
    return calls


def summarise(calls):
    split_labels = ["start", "lookup", "Q", "tile0", "loop", "stored"]
    comb_labels = ["start", "released", "stored"]
    for (b, kv), runs in calls.items():
        rows = {}
        for run in runs:
            splits = [r for r in run if r[0] == "split"]
            combs = [r for r in run if r[0] == "combine"]
            if not splits:
                continue
            base = min(r[3] for r in splits)
            for name, x, y, t0, rel in splits:
                key = f"split  x={x:<4d} y={y:<3d}"
                stamps = [t0 - base] + [t0 - base + d for d in rel]
                rows.setdefault(key, []).append(stamps)
            for name, x, y, t0, rel in combs:
                key = f"combine x={x:<4d}      "
                stamps = [t0 - base] + [t0 - base + d for d in rel]
                rows.setdefault(key, []).append(stamps)
        print(f"== B={b} kv={kv}: us after the first traced split CTA started (median of {len(runs)} calls)")
        print(f"   split: {', '.join(split_labels)} | combine: {', '.join(comb_labels)}")
        for key in sorted(rows):
            vals = rows[key]
            n = min(len(v) for v in vals)
            med = [statistics.median(v[i] for v in vals) / 1000 for i in range(n)]
            print(f"   {key} " + " ".join(f"{m:7.2f}" for m in med))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--child":
        shapes = [tuple(int(x) for x in s.split(":")) for s in args[2].split(",")]
        child(args[1], shapes)
        return
    fmt = "fp8"
    shapes = "4:1024,4:8192,32:1024,64:1024"
    i = 0
    while i < len(args):
        if args[i] == "--shapes":
            shapes = args[i + 1]
            i += 2
        else:
            fmt = args[i]
            i += 1
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", fmt, shapes],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise SystemExit(out.returncode)
    lines = out.stdout.splitlines()
    if not any(ln.startswith("TRACE") for ln in lines):
        raise SystemExit("no TRACE lines: build with MLA_DECODE_TRACE=1 (see the docstring)")
    print(f"format {fmt}")
    summarise(parse(lines))


if __name__ == "__main__":
    main()
