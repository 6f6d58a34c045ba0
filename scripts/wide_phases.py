"""Where the time of one wide-kernel call goes, CTA by CTA: start-up, tile loop, epilogue, and
how the CTAs' spans lie against each other (launch skew, the start-up burst, the tail).

Needs a trace build (MLA_DECODE_TRACE=1 python3 setup.py build_ext --inplace; kernels.md
"Tools"): the wide kernel's CtaPhases (csrc/kernels/common/trace.cuh) record, for thread 0
(scores) and thread 128 (values) of every CTA, SM cycles at five points and %globaltimer at the
first and last, and the launcher prints them after each call:

    python3 scripts/wide_phases.py [--format bf16] [--shapes 64:1024,32:8192] [--heads 128] [--calls 5]

The calls run in a child process (the kernels' printf reaches its stdout), q_len 1, the H = 128
sweep's inputs rotated over copies worth 3x L2 as the sweep rotates them, one call at a time
(each one followed by the probes' print kernels, so a call starts on an idle GPU: the "alone"
case of scripts/kernel_timeline.py). Per shape it prints, for each quantity, the median over the
calls of its median, minimum and maximum over the CTAs:

  start       the CTA's first clock, after the first CTA's (us, %globaltimer)
  Q stored    scores: start -> Q in shared memory (us)
  QK(0)       scores: start -> the first tile's scores computed (us)
  per tile    scores: QK(0) done -> QK(last) done, per tile after the first (SM cycles and us)
  tail        scores: QK(last) done -> final (m, l) stored (us)
  PV(0)       values: start -> the first tile's PV complete (us)
  epilogue    values: PV(last) complete -> outputs stored (us)
  finish      the values' last clock, after the first CTA's start (us)

and the span of the call (first start to last finish) and the SM clock (cycles per %globaltimer
ns over each role's span). The probes themselves cost a few global stores per CTA, and in a
trace build the fp8 and MXFP4 forms spill a few bytes that the normal build does not.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
POINTS = 5  # CtaPhases<kPhasePoints> of csrc/kernels/sm90/wide_kernel.cuh


def parse(lines):
    """The child's stdout -> {(b, kv): [call, ...]}, a call being {(x, y): {role: record}} with
    record = dict(sm, count, g_start, g_finish, clocks=[c1 - c0, ..., c4 - c0] (-1: not reached))."""
    calls = {}
    cur = None
    for ln in lines:
        f = ln.split()
        if not f:
            continue
        if f[0] == "CALL" and len(f) >= 4:
            cur = {}
            calls.setdefault((int(f[1]), int(f[2])), []).append(cur)
        elif f[0] == "PHASES" and cur is not None:
            if len(f) != 8 + POINTS - 1:
                raise ValueError(f"PHASES line with {len(f)} fields, expected {8 + POINTS - 1}: {ln!r}")
            role, x, y, sm, count, g0, g1 = (int(v) for v in f[1:8])
            cur.setdefault((x, y), {})[role] = dict(sm=sm, count=count, g_start=g0, g_finish=g1,
                                                    clocks=[int(v) for v in f[8:]])
    return calls


def call_quantities(call):
    """One call's records -> ({quantity: [value per CTA]}, span_us, [GHz per role record])."""
    recs = [r for roles in call.values() for r in roles.values() if r["g_start"] >= 0 and r["g_finish"] >= 0]
    if not recs:
        return {}, None, []
    g0 = min(r["g_start"] for r in recs)
    span_us = (max(r["g_finish"] for r in recs) - g0) / 1000.0
    q = {}
    ghz = []

    def add(name, value):
        q.setdefault(name, []).append(value)

    for roles in call.values():
        for role, r in roles.items():
            clocks = r["clocks"]
            ns = r["g_finish"] - r["g_start"]
            last = clocks[-1]
            if ns <= 0 or last <= 0:
                continue
            rate = last / ns  # cycles per ns (GHz)
            ghz.append(rate)
            us = lambda cycles: cycles / rate / 1000.0  # noqa: E731
            if role == 0:
                add("start (us)", (r["g_start"] - g0) / 1000.0)
                if clocks[0] >= 0:
                    add("scores: start -> Q stored (us)", us(clocks[0]))
                if clocks[1] >= 0:
                    add("scores: start -> QK(0) done (us)", us(clocks[1]))
                if clocks[1] >= 0 and clocks[2] >= 0 and r["count"] > 1:
                    per = (clocks[2] - clocks[1]) / (r["count"] - 1)
                    add("scores: per tile after the first (cycles)", per)
                    add("scores: per tile after the first (us)", us(per))
                if clocks[2] >= 0:
                    add("scores: QK(last) -> final stored (us)", us(last - clocks[2]))
            else:
                if clocks[1] >= 0:
                    add("values: start -> PV(0) done (us)", us(clocks[1]))
                if clocks[2] >= 0:
                    add("values: PV(last) -> outputs stored (us)", us(last - clocks[2]))
                add("finish (us)", (r["g_finish"] - g0) / 1000.0)
    return q, span_us, ghz


def summarise(calls, label=""):
    """Printable lines: per shape, each quantity's median / min / max over the CTAs, median over calls."""
    out = []
    med = statistics.median
    for (b, kv), runs in calls.items():
        per_q = {}
        spans, rates, ctas, tiles = [], [], [], []
        for call in runs:
            q, span, ghz = call_quantities(call)
            if span is None:
                continue
            spans.append(span)
            rates += ghz
            ctas.append(len(call))
            tiles += [r["count"] for roles in call.values() for r in roles.values()]
            for name, vals in q.items():
                per_q.setdefault(name, []).append((med(vals), min(vals), max(vals)))
        if not spans:
            out.append(f"== {label}B={b} kv={kv}: no complete PHASES records")
            continue
        out.append(f"== {label}B={b} kv={kv}: {med(ctas):.0f} CTAs, {med(tiles):.0f} tiles per CTA (median), "
                   f"{len(spans)} calls; span {med(spans):.2f} us (min {min(spans):.2f}); SM clock "
                   f"{med(rates):.2f} GHz")
        out.append(f"   {'over the CTAs (median over calls):':44s} {'median':>9s} {'min':>9s} {'max':>9s}")
        for name, per_call in per_q.items():
            out.append(f"   {name:44s} " + " ".join(f"{med(c[i] for c in per_call):9.2f}" for i in range(3)))
    return out


def child(fmt, shapes, heads, calls, device="cuda"):
    """The calls, printing CALL lines for the probes' PHASES lines to follow (any device: on the
    CPU the same calls run the CPU kernel and print no PHASES lines, which is how the tests check
    this path)."""
    import ctypes

    import torch

    sys.path.insert(0, os.path.join(HERE, ".."))
    import mla_decode
    from mla_decode.bench.metrics import KV_BYTES_PER_TOKEN
    from mla_decode.bench.providers import cache_of
    from mla_decode.bench.sections import rotated_sets
    from mla_decode.inputs import generate_input

    # The kernels' printf output reaches the C library's stdout at each synchronisation; flushed
    # there, it follows the CALL line printed (and flushed) before the call.
    flush_c_stdout = ctypes.CDLL(None).fflush
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if cuda else 0
    print(f"DEVICE {torch.cuda.get_device_name(dev) if cuda else dev}", flush=True)
    for b, kv in shapes:
        q, kv_data, qo, kvp, cfg = generate_input(b, 1, kv, seed=3, device=dev, num_heads=heads)
        cache, scale = cache_of(kv_data, fmt)
        sm = float(cfg["sm_scale"])
        plan = mla_decode.explain(q, cache, qo, kv_scale=scale, kv_indptr=kvp, sm_scale=sm)
        print(f"PLAN {b} {kv} {plan}", flush=True)
        set_bytes = b * kv * KV_BYTES_PER_TOKEN[fmt] + q.numel() * q.element_size()
        sets = rotated_sets(q, cache, scale, set_bytes, l2)
        for i in range(2 + calls):
            qq, kk, ss = sets[i % len(sets)]
            if i >= 2:  # two calls to warm up (module load, first launch)
                print(f"CALL {b} {kv} {i - 2}", flush=True)
            mla_decode.decode(qq, kk, qo, kv_scale=ss, kv_indptr=kvp, sm_scale=sm)
            if cuda:
                torch.cuda.synchronize()
            flush_c_stdout(None)
        print("END", flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="bf16", choices=["bf16", "fp8", "mxfp4"])
    ap.add_argument("--shapes", default="64:1024,32:8192,64:8192", help="B:kv,...")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",") if s]
        if not args.shapes or any(len(s) != 2 or min(s) < 1 for s in args.shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes: expected B:kv pairs of positive integers, got {args.shapes!r}")
    if args.heads < 64:
        ap.error(f"--heads: the wide kernel runs H >= 64, got {args.heads}")
    if args.calls < 1:
        ap.error(f"--calls: expected at least 1, got {args.calls}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        child(args.format, args.shapes, args.heads, args.calls)
        return
    import torch
    if not torch.cuda.is_available():
        sys.exit("wide_phases.py: needs a CUDA device and a trace build (MLA_DECODE_TRACE=1)")
    shapes = ",".join(f"{b}:{kv}" for b, kv in args.shapes)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--format", args.format, "--shapes", shapes,
           "--heads", str(args.heads), "--calls", str(args.calls)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        sys.exit(f"wide_phases.py: the child process failed (exit status {res.returncode})")
    lines = res.stdout.splitlines()
    for ln in lines:
        if ln.startswith(("DEVICE", "PLAN")):
            print(ln)
    calls = parse(lines)
    if not any(call for runs in calls.values() for call in runs):
        sys.exit("wide_phases.py: no PHASES lines: build with MLA_DECODE_TRACE=1 (see the docstring), "
                 "and check that the plans above name the wide kernel")
    print("\n".join(summarise(calls, f"{args.format} H={args.heads} ")))


if __name__ == "__main__":
    main()
