#!/usr/bin/env python3
"""Benchmark for mla_decode (absorbed MLA decode attention).

One command on a GPU machine:

    python benchmarks/bench_decode.py --out DIR

(a) Competition protocol (H = 16, q_len = 1): for each cache format (mxfp4, fp8, bf16),
    the 8 shapes batch {4, 32, 64, 256} x kv {1024, 8192}.  Every timed call is
    ``synchronize; flush L2; event; mla_decode.custom_kernel(data); event; synchronize``,
    i.e. one whole Python call, host overhead included.  Score = geometric mean over the 8
    shapes of the mean time.
(b) H = 128 sweep (--sweep-heads): batch {1, 4, 32, 64, 256} x kv {1024, 8192}, torch.ops.mla_decode.decode
    captured in a CUDA graph and replayed many times between two events (device time per
    call; no L2 flush, but input copies are rotated so small shapes do not sit in L2).
(c) Peers when importable: FlashMLA (bf16 paged cache, block 64) and FlashInfer
    (BatchMLAPagedAttentionWrapper).  Skipped with a printed reason otherwise.

Outputs into --out: competition.csv, sweep_h128.csv (sweep_h<H>.csv), results.json,
competition.png, sweep_h128.png (when matplotlib is there).  The last lines on stdout are a compact summary.

Without a GPU the script runs on the CPU on one tiny shape (batch 4, kv 1024): a smoke test
of the script and of the CPU operator, NOT the GPU protocol.  See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def _import_mla_decode():
    """The installed package; or this checkout's when that import fails or only finds a
    namespace package (a stale editable install)."""
    try:
        import mla_decode as m
        if getattr(m, "__file__", None) and hasattr(m, "custom_kernel"):
            return m
    except ImportError:
        pass
    for k in [k for k in sys.modules if k == "mla_decode" or k.startswith("mla_decode.")]:
        del sys.modules[k]
    sys.path.insert(0, str(REPO_ROOT))
    import mla_decode as m
    return m


mla_decode = _import_mla_decode()
from mla_decode.timing import L2Flusher, time_protocol  # noqa: E402

from mla_decode.inputs import generate_input  # noqa: E402

try:  # optional progress bar
    from tqdm import tqdm as _tqdm
except Exception:  # noqa: BLE001
    _tqdm = None

# --------------------------------------------------------------------------------------
# Constants of the problem and of the machine (H200)
# --------------------------------------------------------------------------------------

FORMATS = ("mxfp4", "fp8", "bf16")
KV_BYTES_PER_TOKEN = {"bf16": 1152, "fp8": 576, "mxfp4": 306}   # 306 = 288 data + 18 E8M0
D_QK, D_V = 576, 512
FLOP_PER_TOKEN_HEAD = 2 * (D_QK + D_V)                           # 2176 per KV token per q row
COMP_BATCHES = (4, 32, 64, 256)
COMP_KVS = (1024, 8192)
SWEEP_BATCHES = (1, 4, 32, 64, 256)
SWEEP_KVS = (1024, 8192)
CPU_SHAPES = [(4, 1024)]
DEFAULT_PEAK_BW = 4.2e12        # B/s: what a device-to-device copy reaches on an H200
DEFAULT_PEAK_FLOPS = 700e12     # FLOP/s: dense bf16 MMA, realistic H200 figure


def log(msg: str = "") -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------

def git_info() -> dict:
    """The commit measured. $GIT_COMMIT wins: a copy of the tree on a remote
    machine can carry a stale .git (the H200 copy reported the previous commit)."""
    info = {"commit": None, "dirty": None}
    if os.environ.get("GIT_COMMIT"):
        info["commit"] = os.environ["GIT_COMMIT"]
        return info
    try:
        info["commit"] = subprocess.check_output(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, text=True, stderr=subprocess.DEVNULL).strip()
        st = subprocess.check_output(
            ["git", "status", "--porcelain"], cwd=REPO_ROOT, text=True, stderr=subprocess.DEVNULL)
        info["dirty"] = bool(st.strip())
    except Exception:  # noqa: BLE001
        pass
    return info


def gather_meta(args, device: torch.device, flush_bytes: int) -> dict:
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device_type": device.type,
        "git": git_info(),
        "args": vars(args),
        "peak_bw_Bps": args.peak_bw,
        "peak_flops": args.peak_tflops * 1e12,
        "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
        "flush_bytes": flush_bytes,
    }
    try:
        meta["mla_decode_info"] = mla_decode.info()
    except Exception as exc:  # noqa: BLE001
        meta["mla_decode_info"] = f"unavailable: {exc}"
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        meta["gpu"] = torch.cuda.get_device_name(device)
        meta["gpu_sm_count"] = p.multi_processor_count
        meta["gpu_mem_bytes"] = p.total_memory
        meta["gpu_l2_bytes"] = getattr(p, "L2_cache_size", None)
        meta["gpu_cc"] = f"{p.major}.{p.minor}"
    else:
        meta["gpu"] = None
        meta["cpu"] = platform.processor() or platform.machine()
        meta["cpu_threads"] = torch.get_num_threads()
    return meta


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------

def metrics(fmt: str, batch: int, kv: int, heads: int, q_len: int, t_us: float | None,
            peak_bw: float, peak_flops: float) -> dict:
    tokens = batch * kv
    kv_bytes = tokens * KV_BYTES_PER_TOKEN.get(fmt, 0)
    io_bytes = batch * q_len * heads * (D_QK + D_V) * 2          # q in + out, bf16
    flops = FLOP_PER_TOKEN_HEAD * heads * q_len * tokens
    floor_mem = kv_bytes / peak_bw * 1e6
    floor_cmp = flops / peak_flops * 1e6
    floor = max(floor_mem, floor_cmp)
    m = {"kv_tokens": tokens, "kv_bytes": kv_bytes, "io_bytes": io_bytes, "flops": flops,
         "floor_mem_us": floor_mem, "floor_compute_us": floor_cmp, "floor_us": floor,
         "gbps_kv": None, "tflops": None, "pct_floor": None}
    if t_us and t_us > 0:
        m["gbps_kv"] = kv_bytes / (t_us * 1e-6) / 1e9
        m["tflops"] = flops / (t_us * 1e-6) / 1e12
        m["pct_floor"] = 100.0 * floor / t_us
    return m


def stats(times_us: list) -> dict:
    if not times_us:
        return {"mean_us": None, "median_us": None, "min_us": None, "std_us": None, "n": 0}
    return {"mean_us": statistics.fmean(times_us), "median_us": statistics.median(times_us),
            "min_us": min(times_us),
            "std_us": statistics.pstdev(times_us) if len(times_us) > 1 else 0.0,
            "n": len(times_us)}


def geomean(vals):
    vals = [v for v in vals if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# --------------------------------------------------------------------------------------
# Timers
# --------------------------------------------------------------------------------------

def time_graph(calls, device: torch.device, target_s: float, windows: int, min_calls_per_graph: int):
    """Device time per call by CUDA-graph replay.

    ``calls``: list of zero-argument callables (one per rotated input copy).  The graph holds
    ``reps * len(calls)`` calls; it is replayed ``n_rep`` times between two events, ``windows``
    times; returns (per-call us of each window, method, calls_per_graph).
    On the CPU (or if capture fails) falls back to an eager loop (``method`` says which).
    """
    n_copies = len(calls)
    reps = max(1, -(-min_calls_per_graph // n_copies))
    per_graph = reps * n_copies
    if device.type != "cuda":
        return _time_eager(calls, device, target_s, windows, per_graph), "eager-loop(cpu)", per_graph
    # warm up on a side stream (recommended before capture)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for _ in range(reps):
                for c in calls:
                    c()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        log(f"    graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); timing an eager loop")
        del g
        return _time_eager(calls, device, target_s, windows, per_graph), "eager-loop(capture failed)", per_graph
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    n_rep = int(min(max(target_s / windows / one, 3), 2000))
    res = []
    for _ in range(windows):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n_rep):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        res.append(a.elapsed_time(b) * 1e3 / (n_rep * per_graph))
    del g
    return res, "cuda-graph", per_graph


def _time_eager(calls, device, target_s, windows, per_window_min):
    """Back-to-back calls without syncs between them, events (or perf_counter) around."""
    cuda = device.type == "cuda"
    for c in calls:
        c()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    calls[0]()
    if cuda:
        torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(min(max(target_s / windows / one, 1), 5000))
    if cuda:
        n = max(n, per_window_min)
    res = []
    for _ in range(windows):
        if cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            for i in range(n):
                calls[i % len(calls)]()
            b.record()
            torch.cuda.synchronize()
            res.append(a.elapsed_time(b) * 1e3 / n)
        else:
            t0 = time.perf_counter()
            for i in range(n):
                calls[i % len(calls)]()
            res.append((time.perf_counter() - t0) * 1e6 / n)
    return res


# --------------------------------------------------------------------------------------
# Accuracy (optional; float64 reference on the same dequantised cache the kernel reads)
# --------------------------------------------------------------------------------------

_ref_cache: dict = {}


def reference_out(data, fmt: str, device: torch.device, key):
    if key in _ref_cache:
        return _ref_cache[key]
    from mla_decode.reference import dequantize_cache, reference_decode
    q, kv_data, qo_indptr, kv_indptr, config = data
    entry = kv_data[fmt]
    kv, sc = (entry, None) if fmt == "bf16" else entry
    rows = dequantize_cache(kv, sc, dtype=torch.float64)
    out, _ = reference_decode(q, rows, qo_indptr, float(config["sm_scale"]), kv_indptr=kv_indptr,
                              compute_device=device)
    del rows
    _ref_cache.clear()          # keep one at a time: they can be large
    _ref_cache[key] = out
    return out


def accuracy(out, data, fmt, device, key):
    from mla_decode.reference import rel_error
    ref = reference_out(data, fmt, device, key)
    return rel_error(out.reshape(ref.shape), ref)


# --------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------

def _cache_of(kv_data, fmt):
    entry = kv_data[fmt]
    return (entry, None) if fmt == "bf16" else (entry[0], entry[1])


def op_call(q, kv, scale, qo_indptr, kv_indptr, sm_scale):
    out, _ = torch.ops.mla_decode.decode(q, kv, scale, qo_indptr, kv_indptr, None, None, None, 1,
                                         sm_scale, 0)
    return out


def _uniform_len(data) -> int:
    q, kv_data, qo_indptr, kv_indptr, config = data
    b, L = int(config["batch_size"]), int(config["kv_seq_len"])
    if kv_data["bf16"].shape[0] != b * L:
        raise ValueError("peer adapters assume equal KV lengths (the benchmark's inputs)")
    return L


class Peer:
    name = "peer"
    fmt = "bf16"

    def __init__(self):
        self.available = False
        self.reason = "not probed"
        self.version = None

    # The peer's module, and the module whose attribute `required` must exist.
    module = None
    required = (None, None)

    def probe(self, device):
        """Available when on CUDA and its module (with the entry point we call) imports."""
        if device.type != "cuda":
            self.reason = "needs CUDA"
            return
        try:
            import importlib
            mod = importlib.import_module(self.module)
            where, attr = self.required
            getattr(importlib.import_module(where), attr)
            self.mod = mod
            self.version = getattr(mod, "__version__", "unknown")
            self.available = True
            self.reason = ""
        except Exception as exc:  # noqa: BLE001
            self.reason = f"not importable ({type(exc).__name__}: {exc})"

    def prepare(self, data):
        """Shape/length-keyed setup, done once per input set outside the timing."""
        raise NotImplementedError

    def call(self, state):
        """What one decode step costs per layer: returns (total_q, H, 512) bf16."""
        raise NotImplementedError


class FlashMLAPeer(Peer):
    """FlashMLA on the bf16 cache viewed as pages of 64 tokens (zero-copy: lengths are multiples
    of 64 and the cache is contiguous).  Scheduling metadata is computed once per input set in
    prepare() (serving computes it once per step and reuses it over all layers)."""

    name = "flash_mla"
    module = "flash_mla"
    required = ("flash_mla", "flash_mla_with_kvcache")
    PAGE = 64

    def prepare(self, data):
        q, kv_data, qo_indptr, kv_indptr, config = data
        L = _uniform_len(data)
        if L % self.PAGE:
            raise ValueError(f"kv_len {L} is not a multiple of the page size {self.PAGE}")
        b, h, s_q = int(config["batch_size"]), q.shape[1], int(config["q_seq_len"])
        dev = q.device
        kv = kv_data["bf16"]
        n_pages = kv.shape[0] // self.PAGE
        blocked = kv.view(n_pages, self.PAGE, 1, D_QK)
        table = torch.arange(n_pages, dtype=torch.int32, device=dev).view(b, L // self.PAGE)
        seqlens = torch.full((b,), L, dtype=torch.int32, device=dev)
        meta, splits = self.mod.get_mla_metadata(seqlens, s_q * h, 1)
        return {"q": q.view(b, s_q, h, D_QK), "k": blocked, "table": table, "seqlens": seqlens,
                "meta": meta, "splits": splits, "sm": float(config["sm_scale"]),
                "shape": (b * s_q, h, D_V)}

    def call(self, st):
        out, _ = self.mod.flash_mla_with_kvcache(st["q"], st["k"], st["table"], st["seqlens"], D_V,
                                                 st["meta"], st["splits"], softmax_scale=st["sm"],
                                                 causal=False)
        return out.view(st["shape"])


class FlashInferPeer(Peer):
    """FlashInfer's BatchMLAPagedAttentionWrapper on the bf16 cache split into its latent (512)
    and rope (64) parts as strided views (contiguous copies if the views are refused);
    plan() is done once per input set in prepare()."""

    name = "flashinfer"
    module = "flashinfer"
    required = ("flashinfer.mla", "BatchMLAPagedAttentionWrapper")
    PAGE = 64
    _workspace = None

    def prepare(self, data):
        from flashinfer.mla import BatchMLAPagedAttentionWrapper
        q, kv_data, qo_indptr, kv_indptr, config = data
        L = _uniform_len(data)
        b, h = int(config["batch_size"]), q.shape[1]
        dev = q.device
        page = self.PAGE if L % self.PAGE == 0 else 1
        if FlashInferPeer._workspace is None:
            FlashInferPeer._workspace = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device=dev)
        w = BatchMLAPagedAttentionWrapper(FlashInferPeer._workspace, backend="auto")
        kv = kv_data["bf16"].view(-1, page, D_QK)
        ppb = L // page
        kv_ptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * ppb
        kv_idx = torch.arange(b * ppb, dtype=torch.int32, device=dev)
        kv_len = torch.full((b,), L, dtype=torch.int32, device=dev)
        w.plan(qo_indptr, kv_ptr, kv_idx, kv_len, h, D_V, D_QK - D_V, page, False,
               float(config["sm_scale"]), q.dtype, kv.dtype)
        st = {"w": w, "q_nope": q[..., :D_V], "q_pe": q[..., D_V:], "ckv": kv[..., :D_V],
              "kpe": kv[..., D_V:], "shape": (q.shape[0], h, D_V)}
        try:
            self.call(st)
        except Exception:  # noqa: BLE001  strided views refused: use contiguous copies
            st.update(q_nope=st["q_nope"].contiguous(), q_pe=st["q_pe"].contiguous(),
                      ckv=st["ckv"].contiguous(), kpe=st["kpe"].contiguous())
            st["copied"] = True
        return st

    def call(self, st):
        out = st["w"].run(st["q_nope"], st["q_pe"], st["ckv"], st["kpe"])
        return out.view(st["shape"])


PEER_CLASSES = {"flash_mla": FlashMLAPeer, "flashinfer": FlashInferPeer}


# --------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------

class Progress:
    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.desc, self.n, self.enabled = total, desc, 0, enabled
        use_bar = _tqdm is not None and enabled and sys.stderr.isatty()   # plain lines in logs
        self.bar = _tqdm(total=total, desc=desc, leave=False, file=sys.stderr) if use_bar else None

    def step(self, label: str):
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label)
            self.bar.update(1)
        elif self.enabled:
            log(f"  [{self.desc.split()[0]} {self.n}/{self.total}] {label}")

    def close(self):
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------------------
# Rows and tables
# --------------------------------------------------------------------------------------

CSV_FIELDS = ["section", "provider", "format", "batch", "kv_len", "heads", "q_len", "method",
              "n", "mean_us", "median_us", "min_us", "std_us", "gbps_kv", "tflops",
              "floor_mem_us", "floor_compute_us", "floor_us", "pct_floor", "rel_err",
              "kv_tokens", "kv_bytes", "io_bytes", "flops", "seeds", "copies", "note", "error"]


def make_row(section, provider, fmt, batch, kv, heads, q_len, method, times, args,
             rel_err=None, note="", error="", seeds=None, copies=None, primary="mean_us"):
    st = stats(times)
    t = st[primary]
    row = {"section": section, "provider": provider, "format": fmt, "batch": batch, "kv_len": kv,
           "heads": heads, "q_len": q_len, "method": method, **st,
           **metrics(fmt, batch, kv, heads, q_len, t, args.peak_bw, args.peak_tflops * 1e12),
           "rel_err": rel_err, "seeds": seeds, "copies": copies, "note": note, "error": error}
    return row


def _f(v, fmt="{:.2f}", none="-"):
    return none if v is None else fmt.format(v)


def label_of(row):
    return row["format"] if row["provider"] == "mla_decode" else f"{row['provider']}:{row['format']}"


def print_table(rows, title, timing_key, show_compute):
    log("")
    log(title)
    hdr = (f"{'provider':<18}{'B':>5}{'KV':>7}{'H':>5} {timing_key + ' us':>12}{'median us':>11}"
           f"{'min us':>10}{'GB/s':>9}{'TFLOP/s':>9}{'floor us':>10}{'%floor':>8}{'rel_err':>10}  note")
    log(hdr)
    log("-" * len(hdr))
    for r in rows:
        if r["error"]:
            log(f"{label_of(r):<18}{r['batch']:>5}{r['kv_len']:>7}{r['heads']:>5}  ERROR: {r['error'][:110]}")
            continue
        floor_tag = ""
        if show_compute:
            floor_tag = "c" if r["floor_compute_us"] >= r["floor_mem_us"] else "m"
        log(f"{label_of(r):<18}{r['batch']:>5}{r['kv_len']:>7}{r['heads']:>5} "
            f"{_f(r['mean_us']):>12}{_f(r['median_us']):>11}{_f(r['min_us']):>10}"
            f"{_f(r['gbps_kv'], '{:.1f}'):>9}{_f(r['tflops'], '{:.1f}'):>9}"
            f"{_f(r['floor_us']) + floor_tag:>10}{_f(r['pct_floor'], '{:.1f}'):>8}"
            f"{_f(r['rel_err'], '{:.2e}'):>10}  {r['note']}")


def write_csv(path: Path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def summarize(rows, n_shapes):
    """Per provider:format geomean of the mean times over the shapes, and of the floors."""
    out = {}
    for r in rows:
        if r["format"] not in FORMATS:      # a "section aborted" marker row
            continue
        lab = label_of(r)
        d = out.setdefault(lab, {"times": [], "floors": [], "errors": 0})
        if r["error"] or r["mean_us"] is None:
            d["errors"] += 1
            continue
        d["times"].append(r["mean_us"])
        d["floors"].append(r["floor_us"])
    res = {}
    for lab, d in out.items():
        g, gf = geomean(d["times"]), geomean(d["floors"])
        res[lab] = {"geomean_us": g, "geomean_floor_us": gf, "shapes": len(d["times"]),
                    "of": n_shapes, "pct_floor": (100 * gf / g) if (g and gf) else None}
    return res


# --------------------------------------------------------------------------------------
# Plot
# --------------------------------------------------------------------------------------

def plot(rows, path: Path, title: str, value_key: str = "mean_us") -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"skipped ({type(exc).__name__}: {exc})"
    good = [r for r in rows if not r["error"] and r[value_key]]
    if not good:
        return "skipped (no rows)"
    shapes = []
    for r in good:
        s = (r["batch"], r["kv_len"])
        if s not in shapes:
            shapes.append(s)
    labels = []
    for r in good:
        if label_of(r) not in labels:
            labels.append(label_of(r))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(shapes) + 2), 5))
    width = 0.8 / max(1, len(labels))
    for j, lab in enumerate(labels):
        xs, ys, floors = [], [], []
        for i, s in enumerate(shapes):
            for r in good:
                if label_of(r) == lab and (r["batch"], r["kv_len"]) == s:
                    xs.append(i + (j - (len(labels) - 1) / 2) * width)
                    ys.append(r[value_key])
                    floors.append(r["floor_us"])
        ax.bar(xs, ys, width=width, label=lab)
        # each bar's floor (its format's bytes / peak BW, or the compute floor) as a black tick
        ax.hlines(floors, [x - width / 2 for x in xs], [x + width / 2 for x in xs], colors="k", linewidth=1)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"B{b}\nkv{k // 1024}k" if k >= 1024 else f"B{b}\nkv{k}" for b, k in shapes])
    ax.set_yscale("log")
    ax.set_ylabel(f"time per call, us ({value_key.replace('_us', '')}; log scale)")
    ax.set_title(title + "  (black ticks: floor)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return "ok"


# --------------------------------------------------------------------------------------
# The two benchmark sections
# --------------------------------------------------------------------------------------

def comp_shapes(device):
    return list(CPU_SHAPES) if device.type == "cpu" else [(b, k) for b in COMP_BATCHES for k in COMP_KVS]


def sweep_shapes(device):
    return list(CPU_SHAPES) if device.type == "cpu" else [(b, k) for b in SWEEP_BATCHES for k in SWEEP_KVS]


def _cleanup(device):
    _ref_cache.clear()
    if device.type == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001  a sticky CUDA error: later rows will say so
            log(f"    cleanup after the shape failed: {type(exc).__name__}: {exc}")


def competition(args, device, flusher, peers, rows):
    """Appends rows (so a crash keeps what was measured)."""
    shapes = comp_shapes(device)
    n_seeds = args.seeds
    warmup = max(args.warmup, n_seeds)
    prog = Progress(len(shapes), "competition shapes", enabled=not args.no_progress)
    for (b, kv) in shapes:
        try:
            sets = [generate_input(b, 1, kv, seed=args.seed + 1000 * k, device=device) for k in range(n_seeds)]
        except Exception as exc:  # noqa: BLE001
            for fmt in args.formats:
                rows.append(make_row("competition", "mla_decode", fmt, b, kv, 16, 1, "protocol", [], args,
                                     error=f"generate_input failed: {type(exc).__name__}: {exc}"))
            prog.step(f"B{b} kv{kv}: input generation failed")
            continue
        heads = sets[0][0].shape[1]
        do_acc = args.accuracy and b * kv <= args.accuracy_max_tokens
        for fmt in args.formats:
            os.environ["MLA_DECODE_FORMAT"] = fmt
            err, times, rel, note = "", [], None, ""
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    times = time_protocol(lambda i: mla_decode.custom_kernel(sets[i % n_seeds]),
                                          args.iters, warmup, flusher, device)
                fb = [str(w.message) for w in caught if "falling back" in str(w.message)]
                if fb:
                    note = "FALLBACK: " + fb[0][:80]
                if do_acc:
                    out = mla_decode.custom_kernel(sets[0])
                    rel = accuracy(out, sets[0], fmt, device, ("comp", b, kv, fmt, args.seed))
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                if args.verbose:
                    traceback.print_exc()
            rows.append(make_row("competition", "mla_decode", fmt, b, kv, heads, 1, "protocol", times, args,
                                 rel_err=rel, note=note, error=err, seeds=n_seeds))
        for peer in peers:
            err, times, rel, note = "", [], None, ""
            try:
                states = [peer.prepare(s) for s in sets]
                if any(st.get("copied") for st in states if isinstance(st, dict)):
                    note = "contiguous ckv/kpe copies"
                times = time_protocol(lambda i: peer.call(states[i % n_seeds]), args.iters, warmup,
                                      flusher, device)
                if do_acc:
                    rel = accuracy(peer.call(states[0]), sets[0], "bf16", device,
                                   ("comp", b, kv, "bf16", args.seed))
                del states
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                if args.verbose:
                    traceback.print_exc()
            rows.append(make_row("competition", peer.name, peer.fmt, b, kv, heads, 1, "protocol(run only)",
                                 times, args, rel_err=rel, note=note, error=err, seeds=n_seeds))
        del sets
        _cleanup(device)
        done = [r for r in rows[-(len(args.formats) + len(peers)):] if r["mean_us"]]
        prog.step(f"B{b} kv{kv}: " + " ".join(f"{label_of(r)}={r['mean_us']:.1f}us" for r in done))
    prog.close()


def sweep_section(args):
    """The sweep's section name: its rows' `section`, its CSV / PNG stem and its results.json key."""
    return f"sweep_h{args.sweep_heads}"


def sweep(args, device, peers, rows):
    """Appends rows (so a crash keeps what was measured)."""
    heads = args.sweep_heads
    section = sweep_section(args)
    shapes = sweep_shapes(device)
    l2 = 0
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
    rotate_bytes = 3 * l2          # rotate copies until the working set is ~3x L2
    prog = Progress(len(shapes), "sweep shapes", enabled=not args.no_progress)
    for (b, kv) in shapes:
        try:
            data = generate_input(b, 1, kv, seed=args.seed, device=device, num_heads=heads)
        except Exception as exc:  # noqa: BLE001
            for fmt in args.formats:
                rows.append(make_row(section, "mla_decode", fmt, b, kv, heads, 1, "-", [], args,
                                     error=f"generate_input failed: {type(exc).__name__}: {exc}",
                                     primary="median_us"))
            prog.step(f"B{b} kv{kv}: input generation failed")
            continue
        q, kv_data, qo, kvp, cfg = data
        sm = float(cfg["sm_scale"])
        do_acc = args.accuracy and b * kv <= args.accuracy_max_tokens
        q_bytes = q.numel() * q.element_size()
        for fmt in args.formats:
            err, times, rel, method, note, copies = "", [], None, "-", "", 1
            try:
                kv0, sc0 = _cache_of(kv_data, fmt)
                set_bytes = b * kv * KV_BYTES_PER_TOKEN[fmt] + q_bytes
                copies = 1 if device.type != "cuda" else int(min(args.max_copies,
                                                                 max(1, math.ceil(rotate_bytes / set_bytes))))
                sets = [(q, kv0, sc0)] + [(q.clone(), kv0.clone(), None if sc0 is None else sc0.clone())
                                          for _ in range(copies - 1)]
                calls = [(lambda qq=qq, kk=kk, ss=ss: op_call(qq, kk, ss, qo, kvp, sm)) for (qq, kk, ss) in sets]
                times, method, per_graph = time_graph(calls, device, args.sweep_seconds, args.windows,
                                                      args.calls_per_graph)
                note = f"{per_graph} calls/graph" if method == "cuda-graph" else ""
                if do_acc:
                    rel = accuracy(op_call(q, kv0, sc0, qo, kvp, sm), data, fmt, device,
                                   ("sweep", b, kv, fmt, args.seed))
                del sets, calls
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                if args.verbose:
                    traceback.print_exc()
            rows.append(make_row(section, "mla_decode", fmt, b, kv, heads, 1, method, times, args,
                                 rel_err=rel, note=note, error=err, copies=copies, primary="median_us"))
        for peer in peers:
            err, times, rel, method, note, copies = "", [], None, "-", "", 1
            try:
                st = peer.prepare(data)
                if isinstance(st, dict) and st.get("copied"):
                    note = "contiguous ckv/kpe copies; "
                times, method, per_graph = time_graph([lambda: peer.call(st)], device, args.sweep_seconds,
                                                      args.windows, args.calls_per_graph)
                note += f"{per_graph} calls/graph, no rotation" if method == "cuda-graph" else "no rotation"
                if do_acc:
                    rel = accuracy(peer.call(st), data, "bf16", device, ("sweep", b, kv, "bf16", args.seed))
                del st
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                if args.verbose:
                    traceback.print_exc()
            rows.append(make_row(section, peer.name, peer.fmt, b, kv, heads, 1, method, times, args,
                                 rel_err=rel, note=note, error=err, copies=copies, primary="median_us"))
        del data, q, kv_data
        _cleanup(device)
        done = [r for r in rows[-(len(args.formats) + len(peers)):] if r["median_us"]]
        prog.step(f"B{b} kv{kv}: " + " ".join(f"{label_of(r)}={r['median_us']:.1f}us" for r in done))
    prog.close()


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="./bench_out", help="output folder (default ./bench_out)")
    p.add_argument("--formats", default=",".join(FORMATS),
                   help="comma list of cache formats among mxfp4,fp8,bf16 (default all)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per shape (default 50; --quick 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (at least one per seed)")
    p.add_argument("--seeds", type=int, default=None,
                   help="input sets per shape rotated across iterations (default 3; --quick 2)")
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--skip-competition", action="store_true")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--sweep-heads", type=int, default=128,
                   help="query heads of sweep (b) (default 128: DeepSeek without tensor parallelism; "
                        "64 is TP2); its CSV is sweep_h<heads>.csv")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a fast look, not a score)")
    p.add_argument("--peers", default="auto",
                   help="comma list among flash_mla,flashinfer, 'auto' (those importable) or 'none'")
    p.add_argument("--no-accuracy", dest="accuracy", action="store_false",
                   help="skip the float64 reference check (done for shapes with B*kv <= --accuracy-max-tokens)")
    p.add_argument("--accuracy-max-tokens", type=int, default=65536)
    p.add_argument("--allow-fallback", action="store_true",
                   help="let custom_kernel fall back silently-ish (default: MLA_DECODE_STRICT=1, a "
                        "fallback becomes an error row instead of a wrong measurement)")
    p.add_argument("--sweep-seconds", type=float, default=None,
                   help="target timed seconds per sweep row (default 0.3; --quick 0.05)")
    p.add_argument("--windows", type=int, default=5, help="timing windows per sweep row (median reported)")
    p.add_argument("--calls-per-graph", type=int, default=16, help="at least this many calls in one graph")
    p.add_argument("--max-copies", type=int, default=256,
                   help="max rotated input copies per sweep row (copies = ceil(3 x L2 / set bytes))")
    p.add_argument("--flush-mb", type=int, default=None, help="L2 flush buffer (default max(256, 4 x L2))")
    p.add_argument("--peak-bw", type=float, default=DEFAULT_PEAK_BW, help="B/s for the memory floor")
    p.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_FLOPS / 1e12,
                   help="TFLOP/s for the compute floor (bf16 MMA)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar / progress lines")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")
    args = p.parse_args(argv)
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in args.formats if f not in FORMATS]
    if bad:
        p.error(f"unknown formats {bad}; choose among {FORMATS}")
    if args.iters is None:
        args.iters = 10 if args.quick else 50
    if args.seeds is None:
        args.seeds = 2 if args.quick else 3
    if args.sweep_seconds is None:
        args.sweep_seconds = 0.05 if args.quick else 0.3
    if args.quick:
        args.windows = min(args.windows, 3)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.allow_fallback:
        os.environ["MLA_DECODE_STRICT"] = "1"
    t_start = time.time()

    if device.type == "cpu":
        log("=" * 88)
        log("NO GPU: running on the CPU, shape B=4 kv=1024 only. These are CPU wall-clock timings of")
        log("the CPU operator: a smoke test of the script, NOT the GPU competition protocol")
        log("(no CUDA events, no L2 flush, no CUDA graphs). Run on an H200 for real numbers.")
        log("=" * 88)
        if not args.quick:
            log("(hint: --quick keeps the CPU run short)")
    flush_bytes = 0
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
        flush_bytes = (args.flush_mb * 2**20) if args.flush_mb else max(256 * 2**20, 4 * l2)
    flusher = L2Flusher(device, flush_bytes)
    meta = gather_meta(args, device, flush_bytes)
    log(f"mla_decode from {Path(mla_decode.__file__).parent}")
    log(f"device: {meta.get('gpu') or meta.get('cpu')}  torch {torch.__version__}  "
        f"commit {(meta['git']['commit'] or '?')[:12]}{' (dirty)' if meta['git']['dirty'] else ''}")
    info = meta.get("mla_decode_info")
    if isinstance(info, dict):
        log(f"mla_decode: native={info.get('native')} backends={info.get('compiled_backends')}")
        if not info.get("native"):
            log(f"  load error: {info.get('load_error')}")

    # peers
    wanted = [] if args.peers == "none" else (list(PEER_CLASSES) if args.peers == "auto"
                                              else [s.strip() for s in args.peers.split(",") if s.strip()])
    peers, peer_meta = [], {}
    for name in wanted:
        if name not in PEER_CLASSES:
            log(f"peer {name}: unknown (choose among {list(PEER_CLASSES)})")
            continue
        pe = PEER_CLASSES[name]()
        pe.probe(device)
        peer_meta[name] = {"available": pe.available, "version": pe.version, "reason": pe.reason}
        if pe.available:
            log(f"peer {name}: available (version {pe.version})")
            peers.append(pe)
        else:
            log(f"peer {name}: skipped: {pe.reason}")
    meta["peers"] = peer_meta

    comp_rows, sweep_rows = [], []
    if not args.skip_competition:
        log("")
        log(f"== (a) competition protocol: H=16, q_len=1, {args.iters} iters/shape, {args.seeds} rotated "
            f"input sets, L2 flush {flush_bytes // 2**20} MB before each call ==")
        try:
            competition(args, device, flusher, peers, comp_rows)
        except Exception:  # noqa: BLE001
            log("competition section aborted:\n" + traceback.format_exc())
            comp_rows.append(make_row("competition", "mla_decode", "-", 0, 0, 16, 1, "-", [], args,
                                      error="section aborted (traceback above)"))
        print_table(comp_rows, "competition protocol (per-call times over iterations; GB/s, TFLOP/s, %floor "
                    "from the mean; floor = KV bytes / peak BW)", "mean", False)
        write_csv(out_dir / "competition.csv", comp_rows)
    if not args.skip_sweep:
        log("")
        if device.type == "cuda":
            log(f"== (b) H={args.sweep_heads} sweep: torch.ops.mla_decode.decode, CUDA-graph replay, no L2 flush "
                "(input copies rotated to ~3x L2) ==")
        else:
            log(f"== (b) H={args.sweep_heads} sweep: torch.ops.mla_decode.decode, CPU eager loop (no graphs on the CPU) ==")
        try:
            sweep(args, device, peers, sweep_rows)
        except Exception:  # noqa: BLE001
            log("sweep section aborted:\n" + traceback.format_exc())
            sweep_rows.append(make_row(sweep_section(args), "mla_decode", "-", 0, 0, args.sweep_heads, 1, "-", [], args,
                                       error="section aborted (traceback above)"))
        print_table(sweep_rows, f"H={args.sweep_heads} sweep (mean/median/min over timing windows of per-call time; GB/s, "
                    "TFLOP/s, %floor from the median;\n floor = max(memory, compute), m/c = which one binds)",
                    "mean", True)
        write_csv(out_dir / f"{sweep_section(args)}.csv", sweep_rows)

    comp_sum = summarize(comp_rows, len(comp_shapes(device)))
    sweep_sum = {}
    if sweep_rows:
        tmp = [dict(r, mean_us=r["median_us"]) for r in sweep_rows]
        sweep_sum = summarize(tmp, len(sweep_shapes(device)))

    plots = {}
    if comp_rows:
        plots["competition.png"] = plot(comp_rows, out_dir / "competition.png",
                                        f"competition protocol H=16 ({meta.get('gpu') or 'CPU'})")
    if sweep_rows:
        plots[f"{sweep_section(args)}.png"] = plot(sweep_rows, out_dir / f"{sweep_section(args)}.png",
                                       f"H={args.sweep_heads} sweep ({meta.get('gpu') or 'CPU, eager loop'})", "median_us")
    meta["plots"] = plots
    meta["elapsed_s"] = round(time.time() - t_start, 1)
    with open(out_dir / "results.json", "w") as fh:
        json.dump({"meta": meta, "summary": {"competition": comp_sum, sweep_section(args): sweep_sum},
                   "competition": comp_rows, sweep_section(args): sweep_rows}, fh, indent=1, default=str)

    # ---- compact summary: keep these the LAST lines of stdout ----
    log("")
    for k, v in plots.items():
        if v != "ok":
            log(f"plot {k}: {v}")
    log(f"wrote {out_dir}/: " + ", ".join(sorted(p.name for p in out_dir.iterdir() if p.is_file())))
    log("=" * 72)
    where = meta.get("gpu") or "CPU (NOT the GPU protocol)"
    log(f"SUMMARY  {where} | commit {(meta['git']['commit'] or '?')[:10]} | {meta['elapsed_s']} s")
    if comp_sum:
        log(f"competition H=16 geomean of means ({args.iters} iters), vs floor @ {args.peak_bw / 1e12:.1f} TB/s:")
        for lab, s in comp_sum.items():
            inc = "" if s["shapes"] == s["of"] else f"  INCOMPLETE {s['shapes']}/{s['of']} shapes"
            log(f"  {lab:<18} {_f(s['geomean_us']):>9} us   floor {_f(s['geomean_floor_us']):>7} us"
                f"   {_f(s['pct_floor'], '{:.0f}')}% of floor{inc}")
    if sweep_sum:
        methods = sorted({r["method"] for r in sweep_rows if not r["error"]})
        log(f"sweep H={args.sweep_heads} geomean of medians ({', '.join(methods) or '-'}), floor = max(mem, compute):")
        for lab, s in sweep_sum.items():
            inc = "" if s["shapes"] == s["of"] else f"  INCOMPLETE {s['shapes']}/{s['of']} shapes"
            log(f"  {lab:<18} {_f(s['geomean_us']):>9} us   floor {_f(s['geomean_floor_us']):>7} us"
                f"   {_f(s['pct_floor'], '{:.0f}')}% of floor{inc}")
    n_err = sum(1 for r in comp_rows + sweep_rows if r["error"])
    if n_err:
        log(f"{n_err} row(s) FAILED (see the ERROR rows above / results.json)")
    return 0 if n_err == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
