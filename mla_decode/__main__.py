"""python -m mla_decode demo|bench|check|info

demo   generate competition inputs, run custom_kernel in each cache format,
       print its error against exact math on the bf16 cache and its time
       (GPU when there is one, else CPU with small shapes)
bench  the benchmark of benchmarks/bench_decode.py (competition protocol and
       H = 128 sweep; table, CSV and, with --plot, PNG charts); extra
       arguments are passed through (--quick, --formats, --out, ...)
check  a quick self-test of every format against the float64 reference
info   what this build contains
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def _time_call(fn, device, iters):
    """Mean microseconds per call under the competition protocol (mla_decode.timing)."""
    from mla_decode.timing import L2Flusher, time_protocol
    times = time_protocol(lambda i: fn(), iters, 0, L2Flusher(device), device)
    return sum(times) / len(times)


def demo(args) -> int:
    import mla_decode
    from mla_decode.inputs import generate_input
    from mla_decode.reference import dequantize_cache, reference_decode

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    shapes = [(4, 1024), (32, 1024), (64, 8192), (256, 8192)] if device.type == "cuda" else [(4, 1024), (8, 2048)]
    iters = args.iters or (20 if device.type == "cuda" else 3)
    print(f"mla_decode demo on {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'} "
          f"(torch {torch.__version__}); build: {mla_decode.info()['compiled_backends']}")
    if device.type == "cpu":
        print("no GPU: running the C++ CPU operator on small shapes (CPU times are not the GPU protocol)")
    print(f"{'batch':>5} {'kv':>5} {'format':>6} {'time_us':>10} {'rel_err_vs_exact_bf16':>22}")
    for batch, kv in shapes:
        data = generate_input(batch, 1, kv, seed=1000 + batch + kv, device=device)
        q, kv_data, qo, kvp, config = data
        # Exact math on the bf16 cache: the truth every format is judged against.
        ref, _ = reference_decode(q, dequantize_cache(kv_data["bf16"]), qo, config["sm_scale"], kv_indptr=kvp,
                                  compute_device=device if batch * kv <= 32768 or device.type == "cuda" else "cpu")
        ref = ref.cpu()
        for fmt in ("mxfp4", "fp8", "bf16"):
            os.environ["MLA_DECODE_FORMAT"] = fmt
            out = mla_decode.custom_kernel(data)
            rel = float((out.cpu().double() - ref).norm() / ref.norm())
            t = _time_call(lambda: mla_decode.custom_kernel(data), device, iters)
            print(f"{batch:>5} {kv:>5} {fmt:>6} {t:>10.1f} {rel:>22.4f}")
    os.environ.pop("MLA_DECODE_FORMAT", None)
    from .competition import DEFAULT_FORMAT
    print(f"custom_kernel's default format is {DEFAULT_FORMAT} (MLA_DECODE_FORMAT overrides it).")
    return 0


def info(args) -> int:
    import mla_decode
    print(json.dumps(mla_decode.info(), indent=2))
    return 0


def check(args) -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    try:
        from cases import FORMATS, LAYOUTS, check_against_reference, make_case
    except ImportError:
        print("check needs the repository's tests/ folder (run from a source checkout)")
        return 2
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    n = 0
    for dev in devices:
        for fmt in FORMATS:
            for layout in LAYOUTS:
                case = make_case(fmt, layout, 16, 2, [65, 0, 17], seed=n, device=torch.device(dev))
                out, lse = torch.ops.mla_decode.decode(*case.args(), 0)
                check_against_reference(case, out, lse)
                n += 1
                print(f"ok  {dev:<4} {fmt:<8} {layout}")
    print(f"{n} checks passed")
    return 0


def bench(args, extra) -> int:
    import runpy
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "bench_decode.py")
    if not os.path.exists(script):
        print("bench needs the repository's benchmarks/ folder (run from a source checkout)")
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if args.plot:
            print("bench --plot needs matplotlib: pip install matplotlib")
            return 2
    argv = [script] + extra
    if args.out:
        argv += ["--out", args.out]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = old
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run custom_kernel on competition inputs: accuracy and time")
    d.add_argument("--cpu", action="store_true", help="use the CPU even when a GPU is present")
    d.add_argument("--iters", type=int, default=0)
    b = sub.add_parser("bench", help="benchmarks/bench_decode.py: table, CSV, --plot for PNG charts")
    b.add_argument("--plot", action="store_true", help="require the PNG charts (needs matplotlib)")
    b.add_argument("--out", default=None, help="output folder (default ./bench_out)")
    sub.add_parser("info", help="what this build contains")
    sub.add_parser("check", help="quick self-test against the float64 reference")
    args, extra = parser.parse_known_args(argv)
    if args.cmd == "bench":
        return bench(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return {"demo": demo, "info": info, "check": check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
