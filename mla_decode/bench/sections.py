"""The benchmark's two sections: the competition protocol and the H = 128 sweep."""

from __future__ import annotations

import math
import os
import re
import time
import traceback
import warnings

import torch

from ..inputs import generate_input
from ..timing import time_rounds
from .metrics import FORMATS, KV_BYTES_PER_TOKEN
from .providers import cache_of, op_call
from .report import attach_stream_floor, label_of, make_row
from .timers import WindowTimer

COMP_BATCHES = (4, 32, 64, 256)
COMP_KVS = (1024, 8192)
SWEEP_BATCHES = (1, 4, 32, 64, 256)
SWEEP_KVS = (1024, 8192)
CPU_SHAPES = [(4, 1024)]


def comp_shapes(device):
    return list(CPU_SHAPES) if device.type == "cpu" else [(b, k) for b in COMP_BATCHES for k in COMP_KVS]


def sweep_shapes(device):
    return list(CPU_SHAPES) if device.type == "cpu" else [(b, k) for b in SWEEP_BATCHES for k in SWEEP_KVS]


def sweep_section(args) -> str:
    """The sweep's name: its rows' section, its CSV / PNG stem and its results.json key."""
    return f"sweep_h{args.sweep_heads}" + (f"_q{args.sweep_q_len}" if args.sweep_q_len > 1 else "")


def _error_text(exc) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def cleanup(device, log):
    if device.type == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - a sticky CUDA error: later rows will say so
            log(f"    cleanup after the shape failed: {_error_text(exc)}")


class References:
    """The float64 references of one input set: exact math on the bf16 cache (what every format
    is judged against in the end) and on each format's own dequantised cache (what its kernel
    computes, so the format's quantisation error cancels)."""

    def __init__(self, data, device):
        self.data = data
        self.device = device
        self.refs = {}

    def _ref(self, fmt):
        if fmt not in self.refs:
            from ..reference import dequantize_cache, reference_decode
            q, kv_data, qo_indptr, kv_indptr, config = self.data
            kv, sc = cache_of(kv_data, fmt)
            rows = dequantize_cache(kv, sc, dtype=torch.float64)
            for k in [k for k in self.refs if k != "bf16"]:   # keep bf16 and one other
                del self.refs[k]
            self.refs[fmt], _ = reference_decode(q, rows, qo_indptr, float(config["sm_scale"]),
                                                 kv_indptr=kv_indptr, compute_device=self.device)
        return self.refs[fmt]

    def errors(self, out, fmt) -> dict:
        from ..reference import rel_error
        own = self._ref(fmt)
        err_own = rel_error(out.reshape(own.shape), own)
        err_bf16 = err_own if fmt == "bf16" else rel_error(out.reshape(own.shape), self._ref("bf16"))
        return {"err_vs_own_cache": err_own, "err_vs_bf16_exact": err_bf16}


def _fallback_notes(caught) -> dict:
    """format -> the first "falling back" warning custom_kernel issued for it."""
    notes = {}
    for w in caught:
        msg = str(w.message)
        if "falling back" not in msg:
            continue
        m = re.search(r"falling back from native (\w+)", msg)
        for fmt in ([m.group(1)] if m and m.group(1) in FORMATS else FORMATS):
            notes.setdefault(fmt, "FALLBACK: " + msg[:80])
    return notes


# --------------------------------------------------------------------------------------------
# (a) competition protocol
# --------------------------------------------------------------------------------------------

def competition(args, ctx, rows):
    """Appends rows (so a crash keeps what was measured). ctx: device, flusher, peers, floor,
    monitor, log."""
    import mla_decode
    device, log = ctx.device, ctx.log
    shapes = comp_shapes(device)
    n_sets = args.seeds
    warmup = max(args.warmup, n_sets)
    for si, (b, kv) in enumerate(shapes):
        shape_rows = []
        try:
            sets = [generate_input(b, 1, kv, seed=args.seed + 1000 * k, device=device) for k in range(n_sets)]
        except Exception as exc:  # noqa: BLE001
            for fmt in args.formats:
                rows.append(make_row("competition", "mla_decode", fmt, b, kv, 16, 1, "protocol", [], args,
                                     error=f"generate_input failed: {_error_text(exc)}"))
            continue
        heads = sets[0][0].shape[1]
        fns, meta, errors = {}, {}, {}
        for fmt in args.formats:
            fns[("mla_decode", fmt)] = lambda i: mla_decode.custom_kernel(sets[i % n_sets])
            meta[("mla_decode", fmt)] = {"method": "protocol"}
        peer_states = {}
        for peer in ctx.peers:
            key = (peer.name, peer.fmt)
            meta[key] = {"method": "protocol(run only)"}
            try:
                states = peer.prepare([(s[0], s[1]["bf16"]) for s in sets], sets[0][2], sets[0][3], sets[0][4])
                peer_states[key] = (peer, states)
                fns[key] = lambda i, peer=peer, states=states: peer.call(states[i % n_sets])
                if any(st.get("copied") for st in states):
                    meta[key]["note"] = "contiguous ckv/kpe copies"
            except Exception as exc:  # noqa: BLE001
                errors[key] = _error_text(exc)
        if ctx.floor.available:
            for fmt in args.formats:
                key = ("stream", fmt)
                meta[key] = {"method": "protocol", "compute": False}
                try:
                    bufs = ctx.floor.buffers(fmt, b * kv, n_sets, device)
                    fns[key] = lambda i, bufs=bufs: ctx.floor.call(bufs[i % n_sets])
                except Exception as exc:  # noqa: BLE001
                    errors[key] = _error_text(exc)

        def before(key, i):
            if key[0] == "mla_decode":
                os.environ["MLA_DECODE_FORMAT"] = key[1]

        def on_error(key, exc):
            errors[key] = _error_text(exc)
            if args.verbose:
                traceback.print_exception(exc)

        t0 = time.time()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            times = time_rounds(fns, args.iters, warmup, ctx.flusher, device, before=before, on_error=on_error)
        t1 = time.time()
        fallback = _fallback_notes(caught)
        refs = References(sets[0], device) if args.accuracy and b * kv <= args.accuracy_max_tokens else None
        for key in list(meta):
            provider, fmt = key
            m = meta[key]
            extra = {"seeds": n_sets, "note": m.get("note", "")}
            err = errors.get(key, "")
            if provider == "mla_decode" and fmt in fallback:
                extra["note"] = fallback[fmt]
            if refs is not None and not err and provider != "stream":
                try:
                    if provider == "mla_decode":
                        os.environ["MLA_DECODE_FORMAT"] = fmt
                        out = mla_decode.custom_kernel(sets[0])
                    else:
                        peer, states = peer_states[key]
                        out = peer.call(states[0])
                    extra.update(refs.errors(out, fmt))
                except Exception as exc:  # noqa: BLE001
                    err = f"accuracy: {_error_text(exc)}"
            row = make_row("competition", provider, fmt, b, kv, heads, 1, m["method"], times.get(key, []), args,
                           compute=m.get("compute", True), error=err, **extra)
            ctx.monitor.annotate(row, [(t0, t1)], slack_s=0.0)
            shape_rows.append(row)
        os.environ.pop("MLA_DECODE_FORMAT", None)
        attach_stream_floor(shape_rows)
        rows.extend(shape_rows)
        del sets, fns, peer_states, refs
        cleanup(device, log)
        done = [r for r in shape_rows if r["mean_us"]]
        ctx.progress(f"[competition {si + 1}/{len(shapes)}] B{b} kv{kv}: "
                     + " ".join(f"{label_of(r)}={r['mean_us']:.1f}us" for r in done))


# --------------------------------------------------------------------------------------------
# (b) H = 128 sweep
# --------------------------------------------------------------------------------------------

class _Entry:
    def __init__(self, provider, fmt, calls, copies, note=""):
        self.provider, self.fmt, self.calls, self.copies, self.note = provider, fmt, calls, copies, note
        self.timer = None
        self.times, self.intervals = [], []
        self.error = ""
        self.out_fn = None      # one untimed call on the first set, for the accuracy


def rotated_sets(q, cache, scale, set_bytes: int, l2_bytes: int, max_copies: int = 256) -> list:
    """The sweep's input rotation: (q, cache, scale) and clones of it, ceil(3 x L2 / set_bytes)
    sets in all (at most max_copies, at least one), so that a row cycling through them reads
    ~3x L2 between two visits of a set and no shape sits in L2. l2_bytes 0 (not a CUDA device):
    one set."""
    copies = 1 if l2_bytes <= 0 else int(min(max_copies, max(1, math.ceil(3 * l2_bytes / set_bytes))))
    return [(q, cache, scale)] + [(q.clone(), cache.clone(), None if scale is None else scale.clone())
                                  for _ in range(copies - 1)]


def sweep(args, ctx, rows):
    """Appends rows (so a crash keeps what was measured)."""
    device, log = ctx.device, ctx.log
    heads, q_len = args.sweep_heads, args.sweep_q_len
    section = sweep_section(args)
    shapes = sweep_shapes(device)
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) if device.type == "cuda" else 0
    l2 = l2 or (50 * 2**20 if device.type == "cuda" else 0)  # a device that reports none: an H200's
    sustained = args.sustained or device.type != "cuda"
    window_s = args.sweep_seconds / args.windows if sustained else args.window_ms / 1000
    gap_s = 0.0 if sustained else args.gap_s
    for si, (b, kv) in enumerate(shapes):
        try:
            data = generate_input(b, q_len, kv, seed=args.seed, device=device, num_heads=heads)
        except Exception as exc:  # noqa: BLE001
            for fmt in args.formats:
                rows.append(make_row(section, "mla_decode", fmt, b, kv, heads, q_len, "-", [], args, primary="median_us",
                                     error=f"generate_input failed: {_error_text(exc)}"))
            continue
        q, kv_data, qo, kvp, cfg = data
        sm = float(cfg["sm_scale"])
        q_bytes = q.numel() * q.element_size()
        sets = {}
        entries = []
        for fmt in list(args.formats) + (["bf16"] if ctx.peers and "bf16" not in args.formats else []):
            kv0, sc0 = cache_of(kv_data, fmt)
            set_bytes = b * kv * KV_BYTES_PER_TOKEN[fmt] + q_bytes
            sets[fmt] = rotated_sets(q, kv0, sc0, set_bytes, l2, args.max_copies)
        for fmt in args.formats:
            calls = [(lambda qq=qq, kk=kk, ss=ss: op_call(qq, kk, ss, qo, kvp, sm)) for qq, kk, ss in sets[fmt]]
            e = _Entry("mla_decode", fmt, calls, len(sets[fmt]))
            e.out_fn = calls[0]
            entries.append(e)
        for peer in ctx.peers:
            try:
                states = peer.prepare([(qq, kk) for qq, kk, _ in sets["bf16"]], qo, kvp, cfg)
                e = _Entry(peer.name, peer.fmt, [(lambda st=st, peer=peer: peer.call(st)) for st in states],
                           len(states), "contiguous ckv/kpe copies" if any(st.get("copied") for st in states) else "")
                e.out_fn = e.calls[0]
            except Exception as exc:  # noqa: BLE001
                e = _Entry(peer.name, peer.fmt, [], len(sets["bf16"]))
                e.error = _error_text(exc)
            entries.append(e)
        # Capture and calibrate every provider of the shape, then time them window by window.
        for e in entries:
            if e.error:
                continue
            try:
                e.timer = WindowTimer(e.calls, device, args.calls_per_graph)
                e.timer.calibrate(window_s)
                if e.timer.capture_error:
                    log(f"    {label_of({'provider': e.provider, 'format': e.fmt})}: graph capture failed "
                        f"({e.timer.capture_error}); timing an eager loop")
            except Exception as exc:  # noqa: BLE001
                e.error = _error_text(exc)
                if args.verbose:
                    traceback.print_exc()
        for _ in range(args.windows):
            for e in entries:
                if e.error or e.timer is None:
                    continue
                if gap_s:
                    time.sleep(gap_s)
                try:
                    us, t0, t1 = e.timer.window()
                    e.times.append(us)
                    e.intervals.append((t0, t1))
                except Exception as exc:  # noqa: BLE001
                    e.error = _error_text(exc)
        do_acc = args.accuracy and b * kv <= args.accuracy_max_tokens
        refs = References(data, device) if do_acc else None
        shape_rows = []
        for e in entries:
            extra = {"copies": e.copies, "gap_s": gap_s, "note": e.note}
            method = "-"
            if e.timer is not None:
                method = e.timer.method
                extra["calls_per_window"] = e.timer.calls_per_window
                e.timer.close()
            if refs is not None and not e.error:
                try:
                    extra.update(refs.errors(e.out_fn(), e.fmt))
                except Exception as exc:  # noqa: BLE001
                    e.error = f"accuracy: {_error_text(exc)}"
            row = make_row(section, e.provider, e.fmt, b, kv, heads, q_len, method, e.times, args, primary="median_us",
                           error=e.error, **extra)
            ctx.monitor.annotate(row, e.intervals)
            shape_rows.append(row)
        rows.extend(shape_rows)
        del data, q, kv_data, sets, entries, refs
        cleanup(device, log)
        done = [r for r in shape_rows if r["median_us"]]
        ctx.progress(f"[sweep {si + 1}/{len(shapes)}] B{b} kv{kv}: "
                     + " ".join(f"{label_of(r)}={r['median_us']:.1f}us" for r in done))
