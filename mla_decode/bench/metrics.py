"""What a row's time means: bytes, FLOPs, the computed floors, summary statistics."""

from __future__ import annotations

import math
import statistics

FORMATS = ("mxfp4", "fp8", "bf16")
KV_BYTES_PER_TOKEN = {"bf16": 1152, "fp8": 576, "mxfp4": 306}   # MXFP4: 288 code bytes + 18 E8M0 scales
D_QK, D_V = 576, 512
FLOP_PER_TOKEN_HEAD = 2 * (D_QK + D_V)                            # QK^T and PV per KV token per query row
# Defaults of --peak-bw / --peak-tflops (an H200: what a device-to-device copy reaches, and a
# realistic dense bf16 MMA rate); the computed floor of a row is max(bytes / bw, FLOPs / rate).
DEFAULT_PEAK_BW = 4.2e12
DEFAULT_PEAK_TFLOPS = 700.0


def cache_bytes(fmt: str, tokens: int) -> int:
    """Bytes of a cache of `tokens` tokens in fmt (0 for a marker row's "-")."""
    return tokens * KV_BYTES_PER_TOKEN.get(fmt, 0)


def metrics(fmt: str, batch: int, kv: int, heads: int, q_len: int, t_us, peak_bw: float, peak_flops: float,
            compute: bool = True) -> dict:
    """Bytes, FLOPs and floors of one (format, shape), and the rates of a time t_us. compute=False:
    a row that only reads the bytes (the streaming floor): no FLOPs."""
    tokens = batch * kv
    kv_bytes = cache_bytes(fmt, tokens)
    flops = FLOP_PER_TOKEN_HEAD * heads * q_len * tokens if compute else 0
    floor_mem = kv_bytes / peak_bw * 1e6
    floor_cmp = flops / peak_flops * 1e6
    m = {"kv_tokens": tokens, "kv_bytes": kv_bytes,
         "io_bytes": batch * q_len * heads * (D_QK + D_V) * 2,     # q in and out, bf16
         "flops": flops, "floor_mem_us": floor_mem, "floor_compute_us": floor_cmp,
         "floor_us": max(floor_mem, floor_cmp), "gbps_kv": None, "tflops": None, "x_floor": None}
    if t_us:
        m["gbps_kv"] = kv_bytes / (t_us * 1e-6) / 1e9
        m["tflops"] = flops / (t_us * 1e-6) / 1e12 if compute else None
        m["x_floor"] = t_us / m["floor_us"]
    return m


def stats(times_us) -> dict:
    if not times_us:
        return {"mean_us": None, "median_us": None, "min_us": None, "std_us": None, "n": 0}
    return {"mean_us": statistics.fmean(times_us), "median_us": statistics.median(times_us),
            "min_us": min(times_us), "std_us": statistics.pstdev(times_us) if len(times_us) > 1 else 0.0,
            "n": len(times_us)}


def geomean(values):
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
