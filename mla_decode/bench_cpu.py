"""CPU benchmark of the decode operator, side by side in one run with plain PyTorch and the
memory floor.

    python -m mla_decode.bench_cpu [--out DIR] [--quick] [--threads 1,2] [--formats bf16,fp8,mxfp4]

For every shape (H in {16, 128}, B in {1, 4, 32}, kv in {1024, 8192}; q_len 1, sm_scale 1/24),
cache format and thread count it times:

* the operator on its automatic path ("op:auto", and which path that resolved to) and on each
  path this CPU can run, forced through the private operator's ``cpu_path`` override
  ("op:avx512", ...; the scalar path only up to ``max_scalar_gflop`` per call, it is slow);
* plain PyTorch on the same cache dequantised to fp32 (dequantisation outside the timing):
  ``softmax(sm_scale * q @ K^T) @ K[:, :512]`` with fp32 bmm, softmax, bmm;
* the memory floor: the cache bytes (bf16 1152, fp8 576, MXFP4 306 per token) over the read
  bandwidth measured in the same run at the same thread count (the sum of a 512 MB fp32 tensor).

Per shape, format and thread count, plain PyTorch and every implementation are timed in three
interleaved rounds (plain, then each implementation, three times; at least one call each per round,
0.3 s per implementation in all, 0.1 s with --quick), so that a change of a shared machine's load
during a shape reaches both sides of a ratio. Every time is the median of all its calls (the CSV
also has the minimum, which is what a shared machine's scheduler leaves least disturbed); the
speedup over plain is the median of the three rounds' paired ratios, shown beside the ratio of the
two minima ("min/min"). The table goes to stdout,
rows to ``cpu_bench.csv`` and, where matplotlib imports, a plot to ``cpu_bench.png`` in the output
folder. The header names the CPU, its vector flags, torch's threads and the load average.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import statistics
import time

import torch

SHAPES_H = (16, 128)
SHAPES_B = (1, 4, 32)
SHAPES_KV = (1024, 8192)
FORMATS = ("bf16", "fp8", "mxfp4")
PATHS = ("scalar", "avx2", "avx512", "avx512_fp32", "amx")
ROW_BYTES = {"bf16": 1152, "fp8": 576, "fp8_fnuz": 576, "mxfp4": 306}
SM_SCALE = 1.0 / 24.0
FIELDS = ("H", "B", "kv", "format", "threads", "gflop", "cache_mb", "floor_ms", "plain_ms", "plain_ms_min",
          "bandwidth_gbps", "impl", "kernel", "ms", "ms_min", "gbps", "pct_floor", "speedup", "speedup_min")
FLAGS_SHOWN = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16",
               "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_description() -> dict:
    """Model name and the vector flags from /proc/cpuinfo (Linux), else platform's view."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.processor(), platform.machine()):
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {"model": model, "flags": [f for f in FLAGS_SHOWN if f in flags], "cores": os.cpu_count()}


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _call_times(fn, min_reps: int, min_time: float, max_reps: int) -> list:
    """Seconds of each of at least min_reps calls, until min_time has passed (at most max_reps)."""
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < min_reps or (time.perf_counter() < t_end and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _times_ms(fn, min_reps: int = 3, min_time: float = 0.3, max_reps: int = 50):
    """(median, min) of repeated calls in ms, after one warm-up call (first touch of outputs and
    scratch, the AMX self-test)."""
    fn()
    times = _call_times(fn, min_reps, min_time, max_reps)
    return statistics.median(times) * 1e3, min(times) * 1e3


def _interleaved_ms(fns, rounds: int = 3, min_time: float = 0.3, max_reps: int = 50):
    """Times the callables of fns in `rounds` interleaved rounds (fns[0], fns[1], ..., then again),
    so that a change of the machine's load during a shape reaches every one of them: one warm-up
    call each first, then per round and callable at least one call and min_time / rounds seconds.
    Returns, per callable, (median ms over all its calls, min ms, its per-round medians)."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    per_round = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            times = _call_times(fn, 1, min_time / rounds, max_reps)
            samples[i].extend(times)
            per_round[i].append(statistics.median(times) * 1e3)
    return [(statistics.median(t) * 1e3, min(t) * 1e3, r) for t, r in zip(samples, per_round)]


def _paired_speedup(plain_rounds, impl_rounds) -> float:
    """The median over rounds of plain's time over the implementation's in the same round."""
    return statistics.median(p / o for p, o in zip(plain_rounds, impl_rounds))


def _median_ms(fn, **kw) -> float:
    return _times_ms(fn, **kw)[0]


def read_bandwidth_gbps(nbytes: int = 512 * 2**20) -> float:
    """Read bandwidth of this thread count: bytes of a large fp32 tensor over the time of its sum."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    ms = _median_ms(lambda: x.sum(), min_reps=5, min_time=0.5)
    return nbytes / (ms * 1e-3) / 1e9


def _make_inputs(H: int, B: int, kv: int, fmt: str, gen: torch.Generator, rows_bf16: torch.Tensor):
    from .quant import quantize_fp8, quantize_mxfp4
    from .reference import dequantize_cache
    q = torch.randn(B, H, 576, generator=gen).to(torch.bfloat16)
    cache = rows_bf16.unsqueeze(1)
    if fmt == "bf16":
        kv_cache, scale = cache.contiguous(), None
    elif fmt == "fp8":
        kv_cache, scale = quantize_fp8(cache, torch.float8_e4m3fn)
    elif fmt == "fp8_fnuz":
        kv_cache, scale = quantize_fp8(cache, torch.float8_e4m3fnuz)
    elif fmt == "mxfp4":
        kv_cache, scale = quantize_mxfp4(cache)
    else:
        raise ValueError(f"bench_cpu: unknown format {fmt!r} (known: bf16, fp8, fp8_fnuz, mxfp4)")
    qo_indptr = torch.arange(B + 1, dtype=torch.int32)
    kv_indptr = torch.arange(B + 1, dtype=torch.int32) * kv
    deq = dequantize_cache(kv_cache, scale).reshape(B, kv, 576)  # fp32, outside the timing
    return q, kv_cache, scale, qo_indptr, kv_indptr, deq


def _plain(q32: torch.Tensor, k32: torch.Tensor) -> torch.Tensor:
    s = torch.bmm(q32, k32.transpose(1, 2)) * SM_SCALE
    return torch.bmm(torch.softmax(s, dim=-1), k32[:, :, :512])


def available_paths() -> list:
    import mla_decode
    q = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    kv = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    ind = torch.tensor([0, 1], dtype=torch.int32)
    out = []
    for path in PATHS:
        plan = mla_decode.explain(q, kv, ind, kv_indptr=ind, overrides={"cpu_path": path})
        if not plan.error:
            out.append(path)
    return out


def run_cpu_benchmark(out_dir: str | None = None, threads=(1, 2), quick: bool = False, formats=FORMATS,
                      paths=None, max_scalar_gflop: float = 2.0, verbose: bool = True) -> list:
    """Runs the grid; returns one dict per (shape, format, threads, implementation) and writes
    cpu_bench.csv (and cpu_bench.png when matplotlib imports) into out_dir when it is given.
    quick: H 16 and 128 at B 1 and 4, kv 1024 and 8192, fewer repetitions."""
    import mla_decode
    from ._ops import native_available, LOAD_ERROR
    if not native_available():
        raise RuntimeError(LOAD_ERROR)
    cpu = cpu_description()
    avail = available_paths()
    paths = avail if paths is None else [p for p in paths if p in avail]
    auto_kernel = mla_decode.explain(torch.zeros(1, 1, 576, dtype=torch.bfloat16),
                                     torch.zeros(1, 1, 576, dtype=torch.bfloat16),
                                     torch.tensor([0, 1], dtype=torch.int32),
                                     kv_indptr=torch.tensor([0, 1], dtype=torch.int32)).kernel
    shapes_b = SHAPES_B[:2] if quick else SHAPES_B
    min_time = 0.1 if quick else 0.3  # per implementation and shape, over all rounds
    rounds = 3
    old_threads = torch.get_num_threads()
    header = [f"CPU: {cpu['model']} ({cpu['cores']} logical CPUs); flags: {' '.join(cpu['flags'])}",
              f"torch {torch.__version__}; mla_decode {mla_decode.__version__}; auto path: {auto_kernel}; "
              f"paths run: {', '.join(paths)}; load average at start: {load_average()}",
              f"timing: {rounds} interleaved rounds per shape (plain, then each implementation); ms the median "
              f"of all calls, 'vs plain' the median of the rounds' paired ratios, 'min/min' plain's fastest "
              f"call over the implementation's (what a shared machine's load disturbs least)"]
    rows = []
    gen = torch.Generator().manual_seed(0)
    csv_file = None
    writer = None

    def emit(row):
        rows.append(row)
        if verbose:
            print(_table_row(row), flush=True)
        if writer is not None:
            writer.writerow(row)
            csv_file.flush()
    try:
        bandwidth = {}
        for t in threads:
            torch.set_num_threads(t)
            bandwidth[t] = read_bandwidth_gbps()
        header.append("read bandwidth (512 MB fp32 sum): " +
                      ", ".join(f"{t} thread{'s' if t > 1 else ''} {bw:.1f} GB/s" for t, bw in bandwidth.items()))
        if verbose:
            print("\n".join(header), flush=True)
            print(_table_header(), flush=True)
        if out_dir is not None:  # rows are written as they are measured
            os.makedirs(out_dir, exist_ok=True)
            csv_file = open(os.path.join(out_dir, "cpu_bench.csv"), "w", newline="")
            for line in header:
                csv_file.write(f"# {line}\n")
            writer = csv.DictWriter(csv_file, fieldnames=FIELDS)
            writer.writeheader()
        for H in SHAPES_H:
            for B in shapes_b:
                for kv in SHAPES_KV:
                    rows_bf16 = torch.randn(B * kv, 576, generator=gen).to(torch.bfloat16)
                    for fmt in formats:
                        q, cache, scale, qo, kvi, deq = _make_inputs(H, B, kv, fmt, gen, rows_bf16)
                        q32 = q.float()
                        out = torch.empty(B, H, 512, dtype=torch.bfloat16)
                        lse = torch.empty(B, H, dtype=torch.float32)
                        gflop = B * kv * H * 2 * (576 + 512) / 1e9
                        cache_bytes = B * kv * ROW_BYTES[fmt]
                        for t in threads:
                            torch.set_num_threads(t)
                            floor_ms = cache_bytes / (bandwidth[t] * 1e9) * 1e3
                            impls = [("op:auto", None)] + [(f"op:{p}", p) for p in paths]
                            impls = [(n, p) for n, p in impls if not (p == "scalar" and gflop > max_scalar_gflop)]
                            kernels, calls = [], []
                            for name, path in impls:
                                ov = None if path is None else {"cpu_path": path}
                                kernels.append(mla_decode.explain(q, cache, qo, kv_scale=scale, kv_indptr=kvi,
                                                                  sm_scale=SM_SCALE, overrides=ov).kernel)
                                calls.append(lambda ov=ov: mla_decode.decode(
                                    q, cache, qo, kv_scale=scale, kv_indptr=kvi, sm_scale=SM_SCALE, out=out, lse=lse,
                                    _overrides=ov))
                            timed = _interleaved_ms([lambda: _plain(q32, deq)] + calls, rounds=rounds,
                                                    min_time=min_time)
                            plain_ms, plain_min, plain_rounds = timed[0]
                            base = {"H": H, "B": B, "kv": kv, "format": fmt, "threads": t, "gflop": round(gflop, 4),
                                    "cache_mb": round(cache_bytes / 1e6, 3), "floor_ms": round(floor_ms, 4),
                                    "plain_ms": round(plain_ms, 4), "plain_ms_min": round(plain_min, 4),
                                    "bandwidth_gbps": round(bandwidth[t], 2)}
                            emit(dict(base, impl="plain", kernel="torch fp32 bmm/softmax/bmm",
                                      ms=round(plain_ms, 4), ms_min=round(plain_min, 4),
                                      gbps=round(cache_bytes / plain_ms / 1e6, 2),
                                      pct_floor=round(100 * floor_ms / plain_ms, 1), speedup=1.0, speedup_min=1.0))
                            for (name, _), kernel, (ms, ms_min, rounds_ms) in zip(impls, kernels, timed[1:]):
                                emit(dict(base, impl=name, kernel=kernel, ms=round(ms, 4), ms_min=round(ms_min, 4),
                                          gbps=round(cache_bytes / ms / 1e6, 2), pct_floor=round(100 * floor_ms / ms, 1),
                                          speedup=round(_paired_speedup(plain_rounds, rounds_ms), 2),
                                          speedup_min=round(plain_min / ms_min, 2)))
                        del q, cache, scale, deq, q32
    finally:
        torch.set_num_threads(old_threads)
        if csv_file is not None:
            csv_file.write(f"# load average at end: {load_average()}\n")
            csv_file.close()
    header.append(f"load average at end: {load_average()}")
    if verbose:
        print(header[-1])
    if out_dir is not None:
        path = os.path.join(out_dir, "cpu_bench.csv")
        png = _plot(rows, header, os.path.join(out_dir, "cpu_bench.png"))
        if verbose:
            print(f"wrote {path}" + (f" and {png}" if png else " (no plot: matplotlib is not importable)"))
    return rows


def _table_header() -> str:
    return (f"{'H':>4} {'B':>3} {'kv':>5} {'format':>6} {'thr':>3} {'impl':>10} {'kernel':>11} {'ms':>9} "
            f"{'GB/s':>7} {'%floor':>7} {'floor ms':>9} {'vs plain':>8} {'min/min':>8}")


def _table_row(r: dict) -> str:
    kernel = r["kernel"] if r["impl"] != "plain" else "torch"
    return (f"{r['H']:>4} {r['B']:>3} {r['kv']:>5} {r['format']:>6} {r['threads']:>3} {r['impl']:>10} "
            f"{kernel:>11} {r['ms']:>9.3f} {r['gbps']:>7.1f} {r['pct_floor']:>6.1f}% {r['floor_ms']:>9.3f} "
            f"{r['speedup']:>7.2f}x {r['speedup_min']:>7.2f}x")


def _plot(rows: list, header: list, path: str):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    hs = sorted({r["H"] for r in rows})
    ts = sorted({r["threads"] for r in rows})
    fmts = list(dict.fromkeys(r["format"] for r in rows))
    fig, axes = plt.subplots(len(hs), len(ts), figsize=(7 * len(ts), 4.5 * len(hs)), squeeze=False)
    for i, H in enumerate(hs):
        for j, t in enumerate(ts):
            ax = axes[i][j]
            sel = [r for r in rows if r["H"] == H and r["threads"] == t]
            shapes = list(dict.fromkeys((r["B"], r["kv"]) for r in sel))
            x = {s: k for k, s in enumerate(shapes)}
            for fi, fmt in enumerate(fmts):
                color = f"C{fi}"
                for impl, style in (("op:auto", "o-"), ("plain", "s--")):
                    pts = [(x[(r["B"], r["kv"])], r["ms"]) for r in sel if r["format"] == fmt and r["impl"] == impl]
                    if pts:
                        ax.plot(*zip(*pts), style, color=color, label=f"{fmt} {'operator' if impl != 'plain' else 'plain'}")
                floor = [(x[(r["B"], r["kv"])], r["floor_ms"]) for r in sel
                         if r["format"] == fmt and r["impl"] == "plain"]
                if floor:
                    ax.plot(*zip(*floor), ":", color=color, label=f"{fmt} memory floor")
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels([f"B{b}\nkv{kv}" for b, kv in shapes])
            ax.set_yscale("log")
            ax.set_ylabel("ms per call (median)")
            ax.set_title(f"H = {H}, {t} thread{'s' if t > 1 else ''}")
            ax.grid(True, which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle("\n".join(header[:3]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_decode.bench_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench_out", help="folder for cpu_bench.csv / cpu_bench.png (default bench_out)")
    ap.add_argument("--quick", action="store_true", help="B in {1, 4} only, shorter timing")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats (bf16, fp8, fp8_fnuz, mxfp4)")
    ap.add_argument("--paths", default=None, help="comma-separated forced paths to run besides auto (default: all "
                    "this CPU has)")
    ap.add_argument("--max-scalar-gflop", type=float, default=2.0, help="skip the scalar path above this many "
                    "GFLOP per call (default 2)")
    args = ap.parse_args(argv)
    try:
        threads = tuple(int(t) for t in args.threads.split(",") if t)
    except ValueError:
        ap.error(f"--threads must be comma-separated integers, got {args.threads!r}")
    if not threads or min(threads) < 1:
        ap.error(f"--threads needs thread counts >= 1, got {args.threads!r}")
    formats = tuple(f for f in args.formats.split(",") if f)
    for f in formats:
        if f not in ROW_BYTES:
            ap.error(f"--formats: unknown format {f!r} (known: {', '.join(ROW_BYTES)})")
    paths = None if args.paths is None else [p for p in args.paths.split(",") if p]
    if paths is not None:
        for p in paths:
            if p not in PATHS:
                ap.error(f"--paths: unknown path {p!r} (known: {', '.join(PATHS)})")
    run_cpu_benchmark(args.out, threads=threads, quick=args.quick, formats=formats, paths=paths,
                      max_scalar_gflop=args.max_scalar_gflop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
