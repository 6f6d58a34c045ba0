"""python -m mla_decode demo|bench|check|info

demo   generate competition inputs, run custom_kernel in each cache format,
       print its error against exact math on the bf16 cache and its time
       (GPU when there is one, else CPU with small shapes)
bench  the benchmark (mla_decode.bench: competition protocol, H = 128 sweep,
       peers, streaming floor; table, CSV, PNG); `bench --help` lists its flags
check  the built-in check (mla_decode.selfcheck): the operator and
       custom_kernel against float64 on every format and layout, CPU and GPU
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
    import mla_decode
    from mla_decode import selfcheck
    from mla_decode._ops import LOAD_ERROR
    if LOAD_ERROR is not None:
        print(f"check: the native operators are not loaded: {LOAD_ERROR}")
        return 1
    print(f"mla_decode {mla_decode.__version__}: checking torch.ops.mla_decode.decode and custom_kernel against "
          "float64 (MLA_DECODE_STRICT=1: a fallback fails)")
    return selfcheck.run(torch.ops.mla_decode.decode, mla_decode.custom_kernel, strict=True)


def bench(args) -> int:
    from mla_decode import bench as bench_module
    return bench_module.run(args)


def main(argv=None) -> int:
    from mla_decode import bench as bench_module
    parser = argparse.ArgumentParser(prog="python -m mla_decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run custom_kernel on competition inputs: accuracy and time")
    d.add_argument("--cpu", action="store_true", help="use the CPU even when a GPU is present")
    d.add_argument("--iters", type=int, default=0, help="timed calls per shape (default 20 on a GPU, 3 on the CPU)")
    b = sub.add_parser("bench", help="the benchmark: table, CSV, PNG (bench --help lists every flag)",
                       description=bench_module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_module.add_arguments(b)
    sub.add_parser("info", help="what this build contains")
    sub.add_parser("check", help="the built-in check against the float64 reference (no repository needed)")
    args = parser.parse_args(argv)
    if args.cmd == "bench":
        return bench(bench_module.finish_args(args, b.error))
    return {"demo": demo, "info": info, "check": check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
