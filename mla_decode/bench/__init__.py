"""The mla_decode benchmark: python -m mla_decode bench [flags]
(benchmarks/bench_decode.py in a checkout is the same command).

On a GPU:

(a) Competition protocol (H = 16, q_len 1): batch {4, 32, 64, 256} x kv {1024,
    8192}. Every timed call is: synchronise; flush L2 (mla_decode.timing: a
    buffer of max(1 GiB, 4 x L2) rewritten with random numbers); event; one
    whole mla_decode.custom_kernel(data) call; event; synchronise. Providers are
    interleaved call by call on the same rotated input sets: mla_decode in each
    format (MLA_DECODE_FORMAT), the peers, and the streaming floor of each
    format (a kernel that only reads that format's cache bytes). Score: the
    geometric mean over the shapes of the mean time; each row also gives its
    time over the computed floor and over the measured streaming floor.
(b) H = 128 sweep (--sweep-heads; --sweep-q-len 2 for MTP, bottom-right causal):
    batch {1, 4, 32, 64, 256} x kv {1024, 8192},
    torch.ops.mla_decode.decode and the peers, each captured in a CUDA graph
    over rotated input copies (~3x L2, so no shape sits in L2). Each row is
    several short windows (--window-ms of GPU work) after idle gaps (--gap-s),
    so every window starts from the same power state (a sustained load drives
    an H200 into its power cap); providers interleaved window by window; the
    median window is reported. --sustained: back-to-back windows instead (the
    power-capped figure). SM clock, power and throttle reasons are sampled by
    nvidia-smi when present.
(c) Peers, when importable: FlashMLA (current and three-argument metadata
    interfaces; bf16 paged cache, block 64) and FlashInfer
    (BatchMLAPagedAttentionWrapper). Skipped with a printed reason otherwise.

Every row: time (us), GB/s of KV cache, TFLOP/s, the computed floor (max of
bytes / --peak-bw and FLOPs / --peak-tflops) and the ratio to it, the ratio to
the streaming floor (competition), and two errors against float64:
err_vs_own_cache (exact math on the cache the row read: the kernel's own
error) and err_vs_bf16_exact (exact math on the bf16 cache: what the format
costs in accuracy).

Outputs in --out: competition.csv, sweep_h128.csv, results.json and, when
matplotlib is importable, competition.png and sweep_h128.png. The last lines
of stdout are a summary. Exit status 1 when a row failed.

Without a GPU: the CPU grid of mla_decode.bench_cpu when that module is
installed, else (or with --cpu-smoke) a one-shape CPU smoke run of the
sections above: CPU wall-clock times, not the GPU protocol.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from .metrics import DEFAULT_PEAK_BW, DEFAULT_PEAK_TFLOPS, FORMATS, KV_BYTES_PER_TOKEN

__all__ = ["add_arguments", "parse_args", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of the benchmark (python -m mla_decode bench and benchmarks/bench_decode.py)."""
    g = p.add_argument_group("what runs")
    g.add_argument("--out", default="./bench_out", help="output folder (default ./bench_out)")
    g.add_argument("--formats", default=",".join(FORMATS),
                   help="comma list of cache formats among mxfp4,fp8,bf16 (default all)")
    g.add_argument("--quick", action="store_true", help="fewer iterations and windows: a fast look, not a score")
    g.add_argument("--skip-competition", action="store_true", help="skip section (a)")
    g.add_argument("--skip-sweep", action="store_true", help="skip section (b)")
    g.add_argument("--sweep-heads", type=int, default=128,
                   help="query heads of sweep (b) (default 128: DeepSeek without tensor parallelism; 64 is TP2); "
                        "its CSV is sweep_h<heads>.csv")
    g.add_argument("--sweep-q-len", type=int, default=1,
                   help="query tokens per item in sweep (b) (default 1; 2 is MTP / speculative decoding: the "
                        "bottom-right causal mask, peers with causal=True); its CSV is sweep_h<heads>_q<q_len>.csv")
    g.add_argument("--peers", default="auto",
                   help="comma list among flash_mla,flashinfer, 'auto' (those importable) or 'none'")
    g.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    g.add_argument("--cpu-smoke", action="store_true",
                   help="the one-shape smoke run of sections (a) and (b) on the CPU (instead of the CPU grid of "
                        "mla_decode.bench_cpu); runs on the CPU even where a GPU is visible")
    g.add_argument("--threads", default="1,2", help="CPU grid: comma list of thread counts (default 1,2)")
    g = p.add_argument_group("competition protocol (a)")
    g.add_argument("--iters", type=int, default=None, help="timed calls per shape and provider (default 50; --quick 10)")
    g.add_argument("--warmup", type=int, default=3, help="untimed calls first (at least one per input set)")
    g.add_argument("--seeds", type=int, default=None,
                   help="input sets per shape rotated across iterations (default 3; --quick 2)")
    g.add_argument("--seed", type=int, default=0, help="base seed (set k uses seed + 1000 k)")
    g.add_argument("--flush-mb", type=int, default=None,
                   help="L2 flush buffer in MiB (default max(1024, 4 x L2), rewritten with random numbers per call)")
    g.add_argument("--allow-fallback", action="store_true",
                   help="let custom_kernel fall back (default: MLA_DECODE_STRICT=1, so a fallback is an error row "
                        "instead of a wrong measurement)")
    g = p.add_argument_group("sweep (b)")
    g.add_argument("--windows", type=int, default=7, help="timing windows per sweep row, median reported (default 7; "
                   "--quick 3)")
    g.add_argument("--window-ms", type=float, default=15.0,
                   help="GPU work per window in ms (default 15): short enough to start and end at the same clock")
    g.add_argument("--gap-s", type=float, default=0.1, help="idle seconds before each window (default 0.1)")
    g.add_argument("--sustained", action="store_true",
                   help="back-to-back windows with no gaps, --sweep-seconds per row: the power-capped figure")
    g.add_argument("--sweep-seconds", type=float, default=None,
                   help="--sustained (and CPU) only: timed seconds per row over all windows (default 0.3; --quick 0.05)")
    g.add_argument("--calls-per-graph", type=int, default=16, help="at least this many calls in one graph (default 16)")
    g.add_argument("--max-copies", type=int, default=256,
                   help="most rotated input copies per row (copies = ceil(3 x L2 / bytes of one set); default 256)")
    g.add_argument("--no-smi", action="store_true", help="do not sample clocks and power with nvidia-smi")
    g = p.add_argument_group("floors and accuracy")
    g.add_argument("--peak-bw", type=float, default=DEFAULT_PEAK_BW,
                   help=f"B/s of the memory floor (default {DEFAULT_PEAK_BW:.3g}: an H200's device copy)")
    g.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS,
                   help=f"TFLOP/s of the compute floor (default {DEFAULT_PEAK_TFLOPS:g}: H200 bf16 MMA)")
    g.add_argument("--no-accuracy", dest="accuracy", action="store_false",
                   help="skip the float64 references (computed for shapes with B x kv <= --accuracy-max-tokens)")
    g.add_argument("--accuracy-max-tokens", type=int, default=65536, help="default 65536")
    g = p.add_argument_group("output")
    g.add_argument("--plot", action="store_true",
                   help="fail when matplotlib is missing (the PNG charts are written whenever it is importable)")
    g.add_argument("--no-progress", action="store_true", help="no per-shape progress lines")
    g.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")


def finish_args(args, error) -> argparse.Namespace:
    """Defaults that depend on --quick, and checks; error(msg) reports a bad flag."""
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in args.formats if f not in FORMATS]
    if bad or not args.formats:
        error(f"--formats: expected a comma list among {','.join(FORMATS)}, got {bad or 'nothing'}")
    try:
        args.threads = tuple(int(t) for t in args.threads.split(",") if t.strip())
    except ValueError:
        error(f"--threads: expected a comma list of integers, got {args.threads!r}")
    if args.iters is None:
        args.iters = 10 if args.quick else 50
    if args.seeds is None:
        args.seeds = 2 if args.quick else 3
    if args.sweep_seconds is None:
        args.sweep_seconds = 0.05 if args.quick else 0.3
    if args.quick:
        args.windows = min(args.windows, 3)
    for name in ("iters", "seeds", "windows", "calls_per_graph", "max_copies"):
        if getattr(args, name) < 1:
            error(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    if args.window_ms <= 0 or args.gap_s < 0 or args.sweep_seconds <= 0:
        error(f"--window-ms and --sweep-seconds must be positive and --gap-s non-negative, got {args.window_ms}, "
              f"{args.sweep_seconds}, {args.gap_s}")
    if args.cpu_smoke:
        if args.device not in (None, "cpu"):
            error(f"--cpu-smoke runs on the CPU; it cannot be combined with --device {args.device}")
        args.device = "cpu"
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        error("--plot: matplotlib is not installed (pip install matplotlib)")
    return args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mla_decode bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return finish_args(p.parse_args(argv), p.error)


def log(msg: str = "") -> None:
    print(msg, flush=True)


def git_info() -> dict:
    """The commit measured, when the package runs from a git checkout. $GIT_COMMIT wins (a copy of
    the tree on a remote machine can carry a stale .git)."""
    if os.environ.get("GIT_COMMIT"):
        return {"commit": os.environ["GIT_COMMIT"], "dirty": None}
    info = {"commit": None, "dirty": None}
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return info
    try:
        info["commit"] = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=root, text=True,
                                                 stderr=subprocess.DEVNULL).strip()
        st = subprocess.check_output(["git", "status", "--porcelain"], cwd=root, text=True, stderr=subprocess.DEVNULL)
        info["dirty"] = bool(st.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def gather_meta(args, device, flush_bytes, mla_decode) -> dict:
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "torch_hip": torch.version.hip, "device_type": device.type, "git": git_info(),
            "mla_decode_version": mla_decode.__version__, "args": vars(args), "peak_bw_Bps": args.peak_bw,
            "peak_flops": args.peak_tflops * 1e12, "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
            "flush_bytes": flush_bytes}
    try:
        meta["mla_decode_info"] = mla_decode.info()
    except Exception as exc:  # noqa: BLE001
        meta["mla_decode_info"] = f"unavailable: {exc}"
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        meta.update(gpu=torch.cuda.get_device_name(device), gpu_sm_count=p.multi_processor_count,
                    gpu_mem_bytes=p.total_memory, gpu_l2_bytes=getattr(p, "L2_cache_size", None),
                    gpu_cc=f"{p.major}.{p.minor}")
    else:
        meta.update(gpu=None, cpu=platform.processor() or platform.machine(), cpu_threads=torch.get_num_threads())
    return meta


class _Context:
    def __init__(self, device, flusher, peers, floor, monitor, progress):
        self.device, self.flusher, self.peers, self.floor, self.monitor = device, flusher, peers, floor, monitor
        self.log = log
        self.progress = progress


def run_cpu_grid(args, out_dir: Path) -> int:
    """The CPU grid of mla_decode.bench_cpu (a machine without a GPU)."""
    from .. import bench_cpu
    log(f"no GPU: the CPU grid of mla_decode.bench_cpu (threads {','.join(map(str, args.threads))}, "
        f"formats {','.join(args.formats)}{', quick' if args.quick else ''}); --cpu-smoke runs the one-shape "
        "smoke run instead")
    t0 = time.time()
    rows = bench_cpu.run_cpu_benchmark(out_dir, threads=args.threads, quick=args.quick, formats=tuple(args.formats))
    rows = list(rows or [])
    failed = sum(1 for r in rows if isinstance(r, dict) and r.get("error"))
    log(f"SUMMARY  CPU grid | {len(rows)} rows, {failed} failed | {time.time() - t0:.1f} s | written to {out_dir}")
    return 0 if failed == 0 else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    return run(args)


def run(args) -> int:
    import mla_decode
    from ..timing import L2Flusher
    from . import report, sections
    from .providers import PEER_CLASSES, StreamFloor
    from .timers import GpuMonitor, NullMonitor

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        log("--device cuda: no GPU is visible")
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if device.type == "cpu" and not args.cpu_smoke and importlib.util.find_spec("mla_decode.bench_cpu") is not None:
        return run_cpu_grid(args, out_dir)
    if not args.allow_fallback:
        os.environ["MLA_DECODE_STRICT"] = "1"
    t_start = time.time()
    if device.type == "cpu":
        log("=" * 88)
        log("NO GPU: the one-shape CPU smoke run (B=4, kv=1024): CPU wall-clock times of the CPU operator, a test")
        log("of the benchmark and of the operator, NOT the GPU protocol (no CUDA events, L2 flush or graphs).")
        log("=" * 88)
    flusher = L2Flusher(device, args.flush_mb * 2**20 if args.flush_mb else None)
    meta = gather_meta(args, device, flusher.nbytes, mla_decode)
    log(f"mla_decode {mla_decode.__version__} from {Path(mla_decode.__file__).parent}")
    log(f"device: {meta.get('gpu') or meta.get('cpu')}  torch {torch.__version__}  "
        f"commit {(meta['git']['commit'] or '-')[:12]}{' (dirty)' if meta['git']['dirty'] else ''}")
    info = meta.get("mla_decode_info")
    if isinstance(info, dict) and not info.get("native"):
        log(f"mla_decode's native library is not loaded: {info.get('load_error')}")

    wanted = [] if args.peers == "none" else (list(PEER_CLASSES) if args.peers == "auto"
                                              else [s.strip() for s in args.peers.split(",") if s.strip()])
    peers, peer_meta = [], {}
    for name in wanted:
        if name not in PEER_CLASSES:
            log(f"peer {name}: unknown (choose among {', '.join(PEER_CLASSES)})")
            continue
        pe = PEER_CLASSES[name]()
        pe.probe(device)
        peer_meta[name] = {"available": pe.available, "version": pe.version, "reason": pe.reason,
                           "interface": getattr(pe, "api", None)}
        if pe.available:
            log(f"peer {name}: available (version {pe.version}"
                + (f", {pe.api} metadata interface" if getattr(pe, "api", None) else "") + ")")
            peers.append(pe)
        else:
            log(f"peer {name}: skipped: {pe.reason}")
    meta["peers"] = peer_meta
    floor = StreamFloor(device)
    log("streaming floor: " + ("torch.ops.mla_decode._stream_read" if floor.available
                               else f"unavailable ({floor.reason})"))
    monitor = GpuMonitor(device) if not args.no_smi else NullMonitor("--no-smi")
    if not monitor.available:
        if device.type == "cuda":
            log(f"clock / power monitor: off ({monitor.reason})")
        monitor = NullMonitor(monitor.reason)
    else:
        log(f"clock / power monitor: nvidia-smi every {monitor.period_ms} ms ({monitor.ident})")
    meta["streaming_floor"] = floor.available
    meta["monitor"] = monitor.available
    ctx = _Context(device, flusher, peers, floor, monitor, (lambda m: None) if args.no_progress else log)

    comp_rows, sweep_rows = [], []
    sweep_name = sections.sweep_section(args)
    sweep_label = f"H={args.sweep_heads}" + (f" q_len={args.sweep_q_len}" if args.sweep_q_len > 1 else "")
    monitor.start()
    try:
        if not args.skip_competition:
            log("")
            log(f"== (a) competition protocol: H=16, q_len=1, {args.iters} iterations per shape and provider, "
                f"{args.seeds} rotated input sets, L2 flush {flusher.nbytes // 2**20} MiB of random numbers before "
                "each call, providers interleaved ==")
            try:
                sections.competition(args, ctx, comp_rows)
            except Exception:  # noqa: BLE001
                log("competition section aborted:\n" + traceback.format_exc())
                comp_rows.append(report.make_row("competition", "mla_decode", "-", 0, 0, 16, 1, "-", [], args,
                                                 error="section aborted (traceback above)"))
            report.print_table(comp_rows, "competition protocol (per-call time: mean over iterations; GB/s, "
                               "TFLOP/s and the floor ratios from the mean; x floor: over max(bytes / peak BW, "
                               "FLOPs / peak); x stream: over the streaming floor of the format; err: "
                               "relative Frobenius against float64 on the format's own cache / on the bf16 cache)",
                               log)
            report.write_csv(out_dir / "competition.csv", comp_rows)
        if not args.skip_sweep:
            log("")
            if device.type == "cuda":
                how = (f"back-to-back windows, {args.sweep_seconds} s per row" if args.sustained else
                       f"{args.windows} windows of ~{args.window_ms:g} ms after {args.gap_s:g} s idle gaps")
                log(f"== (b) {sweep_label} sweep: CUDA-graph replay, {how}, "
                    "providers interleaved, "
                    "no L2 flush (input copies rotated to ~3x L2) ==")
            else:
                log(f"== (b) {sweep_label} sweep: CPU eager loop (no graphs on the "
                    "CPU) ==")
            try:
                sections.sweep(args, ctx, sweep_rows)
            except Exception:  # noqa: BLE001
                log("sweep section aborted:\n" + traceback.format_exc())
                sweep_rows.append(report.make_row(sweep_name, "mla_decode", "-", 0, 0, args.sweep_heads,
                                                  args.sweep_q_len, "-", [],
                                                  args, primary="median_us", error="section aborted (traceback above)"))
            report.print_table(sweep_rows, f"{sweep_label} sweep (per-call time: median over windows; mean "
                               "and min also shown; c/m: the compute or the memory floor binds; [MHz, W, throttle "
                               "reasons]: nvidia-smi during the row's windows)", log)
            report.write_csv(out_dir / f"{sweep_name}.csv", sweep_rows)
    finally:
        monitor.stop()

    comp_sum = report.summarize(comp_rows, len(sections.comp_shapes(device)))
    sweep_sum = report.summarize(sweep_rows, len(sections.sweep_shapes(device)))
    plots = {}
    where = meta.get("gpu") or "CPU"
    if comp_rows:
        plots["competition.png"] = report.plot(comp_rows, out_dir / "competition.png",
                                               f"competition protocol H=16 ({where})")
    if sweep_rows:
        plots[f"{sweep_name}.png"] = report.plot(sweep_rows, out_dir / f"{sweep_name}.png",
                                                 f"{sweep_label} sweep ({where})")
    meta["plots"] = plots
    meta["elapsed_s"] = round(time.time() - t_start, 1)
    with open(out_dir / "results.json", "w") as fh:
        json.dump({"meta": meta, "summary": {"competition": comp_sum, sweep_name: sweep_sum},
                   "competition": comp_rows, sweep_name: sweep_rows}, fh, indent=1, default=str)

    # ---- the summary: keep these the LAST lines of stdout ----
    log("")
    for k, v in plots.items():
        if v != "ok":
            log(f"plot {k}: {v}")
    log(f"wrote {out_dir}/: " + ", ".join(sorted(p.name for p in out_dir.iterdir() if p.is_file())))
    log("=" * 72)
    log(f"SUMMARY  {meta.get('gpu') or 'CPU (NOT the GPU protocol)'} | mla_decode {mla_decode.__version__} | commit "
        f"{(meta['git']['commit'] or '-')[:10]} | {meta['elapsed_s']} s")
    report.print_summary(f"competition H=16: geomean of means ({args.iters} iterations), computed floor at "
                         f"{args.peak_bw / 1e12:.1f} TB/s:", comp_sum, log)
    report.print_summary(f"sweep {sweep_label}: geomean of medians, floor = max(memory, compute):", sweep_sum,
                         log)
    n_err = sum(1 for r in comp_rows + sweep_rows if r["error"])
    if n_err:
        log(f"{n_err} row(s) FAILED (see the ERROR rows above / results.json)")
    return 0 if n_err == 0 else 1
