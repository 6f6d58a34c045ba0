"""Where the time of one split-kernel call goes, CTA by CTA, on the Hopper kernels (wide,
narrow, narrow register-V): start-up, tile loop, epilogue, and how the CTAs' spans lie against
each other (launch skew, the start-up burst, the tail).

Needs a trace build (MLA_DECODE_TRACE=1 python3 setup.py build_ext --inplace; kernels.md
"Tools"): the kernels' CtaPhases (csrc/kernels/common/trace.cuh) record, for thread 0 and thread
128 of every CTA, SM cycles at five or six points and %globaltimer at the first and last, and the
launchers print them after each call:

    python3 scripts/cta_phases.py [--format bf16] [--shapes 64:1024,32:8192] [--heads 128]
                                  [--calls 5] [--protocol]

The calls run in a child process (the kernels' printf reaches its stdout), q_len 1, one call at
a time, each one followed by the probes' print kernels (so a call starts on an idle GPU: the
"alone" case of scripts/kernel_timeline.py). By default the inputs rotate over copies worth 3x L2
as the H = 128 sweep's do; --protocol flushes L2 before each call instead, as the competition's
harness does (e.g. --heads 16 --protocol --shapes 4:8192,32:1024,64:8192,256:1024). Per shape it
prints, for each role and point, the median over the calls of its median, minimum and maximum
over the CTAs (us after the role's start, and the last step), each role's tile period (SM cycles
and us), each CTA's start and finish after the first CTA's start, the call's span (first start
to last finish) and the SM clock (cycles per %globaltimer ns over each role's span).

The points (csrc/kernels/sm90/*_kernel.cuh, "Trace builds"):
  wide               thread 0 (scores): Q stored, QK(0) done, QK(last) done, final (m, l) stored;
                     thread 128 (values): first tiles requested, PV(0) done, PV(last) done,
                     outputs stored
  narrow             thread 0 (consumer): Q stored, QK(0) done, QK(last) done, PV(last) done,
                     outputs stored; thread 128 (producers): the end of their work only
  narrow_register_v  thread 0 (scorer): Q stored, QK(0) done, QK(last) done, factors and LSE
                     stored; thread 128 (values): first tiles requested, PV(0) done, PV(last)
                     done, outputs stored
The probes cost a few global stores per CTA; in a trace build the wide kernel's fp8 and MXFP4
forms and the narrow kernel's fp8 form spill a few bytes that the normal build does not.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Per kernel and role (CtaPhases<kPhasePoints> of csrc/kernels/sm90/*_kernel.cuh): (role name,
# labels of points 1.. (None: not recorded), the tile period as (point a, point b, k): the
# cycles from a to b over count - k tiles).
KERNELS = {
    "wide": {0: ("scores", ["Q stored", "QK(0) done", "QK(last) done", "final (m, l) stored"], (2, 3, 1)),
             1: ("values", ["first tiles requested", "PV(0) done", "PV(last) done", "outputs stored"], (2, 3, 1))},
    "narrow": {0: ("consumer", ["Q stored", "QK(0) done", "QK(last) done", "PV(last) done", "outputs stored"],
                   (2, 3, 1)),
               1: ("producers", [None, None, None, None, "end"], None)},
    "narrow_register_v": {
        0: ("scorer", ["Q stored", "QK(0) done", "QK(last) done", "factors and LSE stored"], (2, 3, 1)),
        1: ("values", ["first tiles requested", "PV(0) done", "PV(last) done", "outputs stored"], (2, 3, 1))},
}


def parse(lines):
    """The child's stdout -> {(b, kv): [call, ...]}, a call being {(kernel, x, y): {role: record}}
    with record = dict(sm, count, g_start, g_finish, clocks=[c1 - c0, ..., c4 - c0]); -1: a point
    not reached."""
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
            if len(f) < 2 or f[1] not in KERNELS:
                name = f[1] if len(f) > 1 else ""
                raise ValueError(f"PHASES line of an unknown kernel {name!r} (known: {', '.join(KERNELS)}): {ln!r}")
            want = 9 + len(KERNELS[f[1]][0][1])
            if len(f) != want:
                raise ValueError(f"PHASES line with {len(f)} fields, expected {want} for {f[1]}: {ln!r}")
            role, x, y, sm, count, g0, g1 = (int(v) for v in f[2:9])
            cur.setdefault((f[1], x, y), {})[role] = dict(sm=sm, count=count, g_start=g0, g_finish=g1,
                                                          clocks=[int(v) for v in f[9:]])
    return calls


def call_quantities(call):
    """One call's records -> ({quantity: [value per CTA]}, span_us, [GHz per role record]);
    quantities in the order of the kernel's points."""
    recs = [r for roles in call.values() for r in roles.values() if r["g_start"] >= 0 and r["g_finish"] >= 0]
    if not recs:
        return {}, None, []
    g0 = min(r["g_start"] for r in recs)
    span_us = (max(r["g_finish"] for r in recs) - g0) / 1000.0
    q = {}
    ghz = []

    def add(name, value):
        q.setdefault(name, []).append(value)

    for (kernel, _, _), roles in sorted(call.items()):
        starts = [r["g_start"] for r in roles.values() if r["g_start"] >= 0]
        if starts:
            add("CTA start, after the first CTA's (us)", (min(starts) - g0) / 1000.0)
        for role in sorted(roles):
            r = roles[role]
            name, labels, period = KERNELS[kernel][role]
            clocks = r["clocks"]
            ns = r["g_finish"] - r["g_start"]
            last = clocks[-1]
            if r["g_start"] < 0 or ns <= 0 or last <= 0:
                continue
            rate = last / ns  # cycles per ns (GHz)
            ghz.append(rate)
            prev = (0, "start")
            for k, label in enumerate(labels, start=1):
                if label is None or clocks[k - 1] < 0:
                    continue
                add(f"{name}: start -> {label} (us)", clocks[k - 1] / rate / 1000.0)
                prev_cycles = clocks[prev[0] - 1] if prev[0] > 0 else 0
                if k == len(labels) and prev[0] > 0:
                    add(f"{name}: {prev[1]} -> {label} (us)", (clocks[k - 1] - prev_cycles) / rate / 1000.0)
                prev = (k, label)
            if period is not None:
                pa, pb, less = period
                tiles = r["count"] - less
                if clocks[pa - 1] >= 0 and clocks[pb - 1] >= 0 and tiles > 0:
                    per = (clocks[pb - 1] - clocks[pa - 1]) / tiles
                    add(f"{name}: tile period, {labels[pa - 1]} -> {labels[pb - 1]} (cycles)", per)
                    add(f"{name}: tile period (us)", per / rate / 1000.0)
        finishes = [r["g_finish"] for r in roles.values() if r["g_finish"] >= 0]
        if finishes:
            add("CTA finish, after the first CTA's start (us)", (max(finishes) - g0) / 1000.0)
    return q, span_us, ghz


def summarise(calls, label=""):
    """Printable lines: per shape, each quantity's median / min / max over the CTAs, median over calls."""
    out = []
    med = statistics.median
    for (b, kv), runs in calls.items():
        per_q = {}
        spans, rates, ctas, tiles, kernels = [], [], [], [], set()
        for call in runs:
            q, span, ghz = call_quantities(call)
            if span is None:
                continue
            spans.append(span)
            rates += ghz
            ctas.append(len(call))
            kernels |= {k for k, _, _ in call}
            tiles += [r["count"] for roles in call.values() for r in roles.values()]
            for name, vals in q.items():
                per_q.setdefault(name, []).append((med(vals), min(vals), max(vals)))
        if not spans:
            out.append(f"== {label}B={b} kv={kv}: no complete PHASES records")
            continue
        out.append(f"== {label}B={b} kv={kv}: {', '.join(sorted(kernels))}, {med(ctas):.0f} CTAs, "
                   f"{med(tiles):.0f} tiles per CTA (median), {len(spans)} calls; span {med(spans):.2f} us "
                   f"(min {min(spans):.2f}); SM clock {med(rates):.2f} GHz")
        out.append(f"   {'over the CTAs (median over calls):':58s} {'median':>9s} {'min':>9s} {'max':>9s}")
        for name, per_call in per_q.items():
            out.append(f"   {name:58s} " + " ".join(f"{med(c[i] for c in per_call):9.2f}" for i in range(3)))
    return out


def child(fmt, shapes, heads, calls, protocol=False, device="cuda"):
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
    from mla_decode.timing import L2Flusher

    # The kernels' printf output reaches the C library's stdout at each synchronisation; flushed
    # there, it follows the CALL line printed (and flushed) before the call.
    flush_c_stdout = ctypes.CDLL(None).fflush
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if cuda else 0
    flusher = L2Flusher(dev) if protocol else None
    print(f"DEVICE {torch.cuda.get_device_name(dev) if cuda else dev}", flush=True)
    for b, kv in shapes:
        q, kv_data, qo, kvp, cfg = generate_input(b, 1, kv, seed=3, device=dev, num_heads=heads)
        cache, scale = cache_of(kv_data, fmt)
        sm = float(cfg["sm_scale"])
        plan = mla_decode.explain(q, cache, qo, kv_scale=scale, kv_indptr=kvp, sm_scale=sm)
        print(f"PLAN {b} {kv} {plan}", flush=True)
        set_bytes = b * kv * KV_BYTES_PER_TOKEN[fmt] + q.numel() * q.element_size()
        sets = [(q, cache, scale)] if protocol else rotated_sets(q, cache, scale, set_bytes, l2)
        for i in range(2 + calls):
            qq, kk, ss = sets[i % len(sets)]
            if flusher is not None:
                flusher.flush()
            if cuda:
                torch.cuda.synchronize()
            flush_c_stdout(None)  # the previous call's lines before this CALL line
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
    ap.add_argument("--protocol", action="store_true", help="flush L2 before each call instead of rotating inputs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",") if s]
        if not args.shapes or any(len(s) != 2 or min(s) < 1 for s in args.shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes: expected B:kv pairs of positive integers, got {args.shapes!r}")
    if not 1 <= args.heads <= 128:
        ap.error(f"--heads: expected 1 to 128, got {args.heads}")
    if args.calls < 1:
        ap.error(f"--calls: expected at least 1, got {args.calls}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        child(args.format, args.shapes, args.heads, args.calls, args.protocol)
        return
    import torch
    if not torch.cuda.is_available():
        sys.exit("cta_phases.py: needs a CUDA device and a trace build (MLA_DECODE_TRACE=1)")
    shapes = ",".join(f"{b}:{kv}" for b, kv in args.shapes)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--format", args.format, "--shapes", shapes,
           "--heads", str(args.heads), "--calls", str(args.calls)] + (["--protocol"] if args.protocol else [])
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        sys.exit(f"cta_phases.py: the child process failed (exit status {res.returncode})")
    lines = res.stdout.splitlines()
    for ln in lines:
        if ln.startswith(("DEVICE", "PLAN")):
            print(ln)
    calls = parse(lines)
    if not any(call for runs in calls.values() for call in runs):
        sys.exit("cta_phases.py: no PHASES lines: build with MLA_DECODE_TRACE=1 (see the docstring), and check "
                 "that the plans above name a Hopper split kernel (wide, narrow, narrow_register_v)")
    mode = "protocol (L2 flushed)" if args.protocol else "rotated inputs"
    print("\n".join(summarise(calls, f"{args.format} H={args.heads} {mode}: ")))


if __name__ == "__main__":
    main()
