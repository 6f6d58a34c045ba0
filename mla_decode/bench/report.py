"""Rows, tables, CSV files, plots and summaries of the benchmark."""

from __future__ import annotations

import csv
from pathlib import Path

from .metrics import FORMATS, geomean, metrics, stats

CSV_FIELDS = [
    "section", "provider", "format", "batch", "kv_len", "heads", "q_len", "method", "n",
    "mean_us", "median_us", "min_us", "std_us", "gbps_kv", "tflops",
    "floor_mem_us", "floor_compute_us", "floor_us", "x_floor", "stream_us", "x_stream",
    "err_vs_own_cache", "err_vs_bf16_exact",
    "kv_tokens", "kv_bytes", "io_bytes", "flops", "seeds", "copies", "calls_per_window", "gap_s",
    "sm_mhz_before", "power_w_before", "sm_mhz_during", "sm_mhz_min", "power_w_max", "throttle", "smi_samples",
    "note", "error"]


def make_row(section, provider, fmt, batch, kv, heads, q_len, method, times, args, *, primary="mean_us",
             compute=True, **extra) -> dict:
    """One result row; `primary` is the statistic the rates and floor ratios are computed from."""
    st = stats(times)
    row = {"section": section, "provider": provider, "format": fmt, "batch": batch, "kv_len": kv,
           "heads": heads, "q_len": q_len, "method": method, "primary": primary, **st,
           **metrics(fmt, batch, kv, heads, q_len, st[primary], args.peak_bw, args.peak_tflops * 1e12, compute),
           "stream_us": None, "x_stream": None, "err_vs_own_cache": None, "err_vs_bf16_exact": None,
           "note": "", "error": ""}
    row.update(extra)
    return row


def label_of(row) -> str:
    return row["format"] if row["provider"] == "mla_decode" else f"{row['provider']}:{row['format']}"


def attach_stream_floor(rows) -> None:
    """Sets stream_us / x_stream of every row from the streaming-floor row of its format and shape."""
    floors = {(r["format"], r["batch"], r["kv_len"]): r[r["primary"]] for r in rows
              if r["provider"] == "stream" and not r["error"] and r[r["primary"]]}
    for r in rows:
        f = floors.get((r["format"], r["batch"], r["kv_len"]))
        if f and r[r["primary"]]:
            r["stream_us"] = f
            r["x_stream"] = r[r["primary"]] / f


def _f(v, fmt="{:.2f}", none="-"):
    return none if v is None else fmt.format(v)


def _g(v, none="-"):
    """Two decimals below 100, none above (CPU smoke ratios run into the thousands)."""
    return none if v is None else (f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}")


def print_table(rows, title, log) -> None:
    log("")
    log(title)
    hdr = (f"{'provider':<18}{'B':>5}{'KV':>7}{'H':>5}{'us':>11}{'median':>10}{'min':>10}{'GB/s':>8}"
           f"{'TFLOP/s':>9}{'floor us':>10}{'x floor':>9}{'x stream':>9}{'err own':>10}{'err bf16':>10}  note")
    log(hdr)
    log("-" * len(hdr))
    for r in rows:
        if r["error"]:
            log(f"{label_of(r):<18}{r['batch']:>5}{r['kv_len']:>7}{r['heads']:>5}  ERROR: {r['error'][:110]}")
            continue
        tag = "c" if r["floor_compute_us"] > r["floor_mem_us"] else "m"
        note = r["note"]
        if r.get("sm_mhz_min") is not None:
            note = (note + " " if note else "") + f"[{r['sm_mhz_min']:.0f}-{r.get('sm_mhz_during') or 0:.0f} MHz" + (
                f", {r['power_w_max']:.0f} W" if r.get("power_w_max") is not None else "") + (
                f", thr {r['throttle']}" if r.get("throttle") not in (None, "0x0") else "") + "]"
        log(f"{label_of(r):<18}{r['batch']:>5}{r['kv_len']:>7}{r['heads']:>5}{_f(r[r['primary']]):>11}"
            f"{_f(r['median_us']):>10}{_f(r['min_us']):>10}{_g(r['gbps_kv']):>8}"
            f"{_g(r['tflops']):>9}{_f(r['floor_us']) + tag:>10}{_g(r['x_floor']):>9}"
            f"{_g(r['x_stream']):>9}{_f(r['err_vs_own_cache'], '{:.1e}'):>10}"
            f"{_f(r['err_vs_bf16_exact'], '{:.1e}'):>10}  {note}")


def write_csv(path: Path, rows) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def summarize(rows, n_shapes: int) -> dict:
    """Per provider:format: geometric means over the shapes of the primary time, of the computed
    floor, of the ratio to it and of the ratio to the streaming floor."""
    acc = {}
    for r in rows:
        if r["format"] not in FORMATS:      # a "section aborted" marker row
            continue
        d = acc.setdefault(label_of(r), {"t": [], "floor": [], "x_floor": [], "x_stream": [], "errors": 0})
        t = r[r["primary"]]
        if r["error"] or not t:
            d["errors"] += 1
            continue
        d["t"].append(t)
        d["floor"].append(r["floor_us"])
        d["x_floor"].append(r["x_floor"])
        if r["x_stream"] is not None:
            d["x_stream"].append(r["x_stream"])
    out = {}
    for lab, d in acc.items():
        out[lab] = {"geomean_us": geomean(d["t"]), "geomean_floor_us": geomean(d["floor"]),
                    "x_floor": geomean(d["x_floor"]),
                    "x_stream": geomean(d["x_stream"]) if len(d["x_stream"]) == len(d["t"]) else None,
                    "shapes": len(d["t"]), "of": n_shapes, "errors": d["errors"]}
    return out


def print_summary(title, summary, log) -> None:
    if not summary:
        return
    log(title)
    for lab, s in summary.items():
        inc = "" if s["shapes"] == s["of"] else f"  INCOMPLETE {s['shapes']}/{s['of']} shapes"
        stream = f"   {_f(s['x_stream'])}x stream floor" if s["x_stream"] is not None else ""
        log(f"  {lab:<18} {_f(s['geomean_us']):>9} us   floor {_f(s['geomean_floor_us']):>8} us"
            f"   {_g(s['x_floor'])}x floor{stream}{inc}")


def plot(rows, path: Path, title: str) -> str:
    """Grouped bars (log scale) of each row's primary time per shape, a black tick at each bar's
    computed floor. Returns "ok" or why it was skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"skipped (matplotlib: {type(exc).__name__}: {exc})"
    good = [r for r in rows if not r["error"] and r[r["primary"]]]
    if not good:
        return "skipped (no rows)"
    shapes, labels = [], []
    for r in good:
        if (r["batch"], r["kv_len"]) not in shapes:
            shapes.append((r["batch"], r["kv_len"]))
        if label_of(r) not in labels:
            labels.append(label_of(r))
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(shapes) + 2), 5))
    width = 0.8 / max(1, len(labels))
    for j, lab in enumerate(labels):
        xs, ys, floors = [], [], []
        for i, s in enumerate(shapes):
            for r in good:
                if label_of(r) == lab and (r["batch"], r["kv_len"]) == s:
                    xs.append(i + (j - (len(labels) - 1) / 2) * width)
                    ys.append(r[r["primary"]])
                    floors.append(r["floor_us"])
        ax.bar(xs, ys, width=width, label=lab)
        ax.hlines(floors, [x - width / 2 for x in xs], [x + width / 2 for x in xs], colors="k", linewidth=1)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"B{b}\nkv{k // 1024}k" if k >= 1024 else f"B{b}\nkv{k}" for b, k in shapes])
    ax.set_yscale("log")
    ax.set_ylabel(f"time per call, us ({good[0]['primary'].replace('_us', '')}; log scale)")
    ax.set_title(title + "  (black ticks: computed floor)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return "ok"
