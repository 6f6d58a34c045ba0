"""The decode plan (csrc/plan), tested on the CPU through mla_decode.explain with an H200's facts:
the kernel and split count at the competition shapes and the H = 128 sweep, the L2 stream hint's
threshold, other devices, and the overrides' errors. A planning change that moves one of the
tables below must come with a measurement (docs/performance.md, "Plan thresholds")."""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import mla_decode
from mla_decode import DeviceFacts

ROOT = Path(__file__).resolve().parent.parent


def shapes(batch, kv, fmt, heads=16, q_len=1, layout="indptr"):
    """Tensors of the right shapes for explain() (never read: torch.empty is not touched)."""
    q = torch.empty(batch * q_len, heads, 576, dtype=torch.bfloat16)
    qo = torch.arange(batch + 1, dtype=torch.int32) * q_len
    rows = batch * kv
    if fmt == "bf16":
        cache, scale = torch.empty(rows, 1, 576, dtype=torch.bfloat16), None
    elif fmt == "fp8":
        cache, scale = torch.empty(rows, 1, 576, dtype=torch.float8_e4m3fn), torch.ones(1)
    else:
        cache, scale = torch.empty(rows, 1, 288, dtype=torch.uint8), torch.empty(rows, 18, dtype=torch.uint8)
    kw = {"kv_scale": scale}
    if layout == "indptr":
        kw["kv_indptr"] = torch.arange(batch + 1, dtype=torch.int32) * kv
    elif layout == "paged":
        page = 64
        cache = cache.view(rows // page, page, *cache.shape[1:])
        kw.update(block_table=torch.arange(rows // page, dtype=torch.int32).view(batch, kv // page),
                  kv_lens=torch.full((batch,), kv, dtype=torch.int32), page_size=page)
    return (q, cache, qo), kw


def plan_of(batch, kv, fmt, heads=16, device=None, **kw):
    args, skw = shapes(batch, kv, fmt, heads, layout=kw.pop("layout", "indptr"))
    return mla_decode.explain(*args, **skw, device=device or DeviceFacts.h200(), **kw)


def label(p):
    return p.kernel + ("+stream" if p.stream_kv else "")


# (kernel[+stream], splits) at the 8 competition shapes (H = 16, q_len 1, indptr layout).
COMPETITION = {
    "bf16": {(4, 1024): ("mma_sync", 32), (4, 8192): ("narrow+stream", 32), (32, 1024): ("narrow+stream", 4),
             (32, 8192): ("narrow", 4), (64, 1024): ("narrow+stream", 2), (64, 8192): ("narrow", 2),
             (256, 1024): ("mma_sync", 1), (256, 8192): ("narrow", 1)},
    "fp8": {(4, 1024): ("mma_sync", 32), (4, 8192): ("mma_sync", 32), (32, 1024): ("mma_sync", 4),
            (32, 8192): ("narrow_register_v+stream", 4), (64, 1024): ("narrow_register_v+stream", 2),
            (64, 8192): ("narrow_register_v", 2), (256, 1024): ("narrow_register_v+stream", 1),
            (256, 8192): ("narrow_register_v", 1)},
    "mxfp4": {(4, 1024): ("mma_sync", 32), (4, 8192): ("narrow", 32), (32, 1024): ("narrow", 4),
              (32, 8192): ("narrow", 4), (64, 1024): ("narrow", 2), (64, 8192): ("narrow", 2),
              (256, 1024): ("narrow", 1), (256, 8192): ("narrow", 1)},
}

# The H = 128 sweep (DeepSeek without tensor parallelism on attention).
SWEEP_H128 = {
    "bf16": {(1, 1024): ("mma_sync", 16), (1, 8192): ("wide", 32), (4, 1024): ("wide", 8), (4, 8192): ("wide", 16),
             (32, 1024): ("wide", 2), (32, 8192): ("wide", 2), (64, 1024): ("wide", 1), (64, 8192): ("wide", 1),
             (256, 1024): ("wide", 1), (256, 8192): ("wide", 1)},
    "fp8": {(1, 1024): ("mma_sync", 16), (1, 8192): ("mma_sync", 32), (4, 1024): ("mma_sync", 8),
            (4, 8192): ("wide", 16), (32, 1024): ("wide", 2), (32, 8192): ("wide", 2), (64, 1024): ("wide", 1),
            (64, 8192): ("wide", 1), (256, 1024): ("wide", 1), (256, 8192): ("wide", 1)},
    "mxfp4": {(1, 1024): ("mma_sync", 16), (1, 8192): ("wide", 32), (4, 1024): ("wide", 8), (4, 8192): ("wide", 16),
              (32, 1024): ("wide", 2), (32, 8192): ("wide", 2), (64, 1024): ("wide", 1), (64, 8192): ("wide", 1),
              (256, 1024): ("wide", 1), (256, 8192): ("wide", 1)},
}


@pytest.mark.parametrize("fmt", sorted(COMPETITION))
def test_competition_shapes_take_the_measured_kernels(fmt):
    for (b, kv), expected in COMPETITION[fmt].items():
        p = plan_of(b, kv, fmt)
        assert (label(p), p.splits) == expected, (fmt, b, kv, str(p))
        assert p.error is None and p.head_groups == 1


@pytest.mark.parametrize("fmt", sorted(SWEEP_H128))
def test_h128_sweep_shapes_take_the_measured_kernels(fmt):
    for (b, kv), expected in SWEEP_H128[fmt].items():
        p = plan_of(b, kv, fmt, heads=128)
        assert (label(p), p.splits) == expected, (fmt, b, kv, str(p))
        assert p.head_groups == (2 if p.kernel == "wide" else 8)
        assert not p.stream_kv  # eight or two head groups: no L2 stream hint


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_many_head_groups_take_one_cta_per_sm_when_a_split_would_hold_one_tile(fmt):
    # mma.sync, 8 head groups, 1 x 1024: two CTAs per SM would give 32 splits of one 32-key tile
    # (256 CTAs); one per SM gives 16 splits (128 CTAs).
    p = plan_of(1, 1024, fmt, heads=128)
    assert (p.kernel, p.head_groups, p.splits) == ("mma_sync", 8, 16), str(p)
    # the same rows of heads from 2 items of 64 heads, or 4 items of 32
    assert plan_of(2, 1024, fmt, heads=64).splits == 16
    assert plan_of(4, 1024, fmt, heads=32).splits == 16
    # the two-per-SM wave (33 splits before the 32-split cap) would leave fewer than two tiles a split
    # at 1 x 2048 too (fp8 there: 12.3 us with 16 splits against 13.9 with 32); at 1 x 4096 it stays
    if fmt == "fp8":
        assert (plan_of(1, 2048, fmt, heads=128).splits, plan_of(1, 4096, fmt, heads=128).splits) == (16, 32)
    # 1.9 tiles a split (8 x 1024, H = 32: 17 splits before the rounding): bf16 and fp8 take one CTA per SM
    # (8 splits), MXFP4 keeps 16 (14.3 us against 14.7 with 8)
    assert plan_of(8, 1024, fmt, heads=32).splits == (16 if fmt == "mxfp4" else 8)
    # one head group keeps its own rule (kOneWaveMaxTiles*), which MXFP4 does not take
    assert plan_of(4, 1024, fmt).splits == 32
    # two CTAs per SM only: an explicit split count is kept
    assert plan_of(1, 1024, fmt, heads=128, num_splits=32).splits == 32


def test_stream_hint_threshold_is_three_times_l2():
    # 3 x 50 MiB: bf16 8 x 32768 (302 MB) and fp8 32 x 32768 (604 MB) go without it, fp8 8 x 32768 (151 MB) takes it.
    assert label(plan_of(8, 32768, "bf16")) == "narrow"
    assert label(plan_of(8, 32768, "fp8")) == "narrow_register_v+stream"
    assert label(plan_of(32, 32768, "fp8")) == "narrow_register_v"
    # the same shape on a device with twice the L2 takes it
    big_l2 = DeviceFacts(l2_bytes=100 * 2**20)
    assert label(plan_of(8, 32768, "bf16", device=big_l2)) == "narrow+stream"
    # unknown L2 (0): never
    assert not plan_of(4, 8192, "bf16", device=DeviceFacts(l2_bytes=0)).stream_kv


def test_tma_forms_need_the_indptr_layout_and_tensor_maps():
    # fp8 on the paged layout: the narrow kernel's f16 QK (no TMA), only for long sequences
    assert plan_of(256, 8192, "fp8", layout="paged").kernel == "narrow"
    assert plan_of(64, 1024, "fp8", layout="paged").kernel == "mma_sync"
    # bf16 tiles land by TMA: no narrow kernel without the indptr layout or without tensor maps
    assert plan_of(256, 8192, "bf16", layout="paged").kernel == "mma_sync"
    no_tma = DeviceFacts(tensor_maps=False)
    assert plan_of(256, 8192, "bf16", device=no_tma).kernel == "mma_sync"
    p = plan_of(256, 8192, "fp8", device=no_tma)
    assert p.kernel == "narrow" and "tensor maps" in p.rejected["narrow_register_v"]


def test_wide_bf16_tiles_land_by_tma_where_the_rows_allow():
    # the wide kernel's bf16 form: TMA tiles on the indptr layout with tensor maps, cp.async otherwise
    assert plan_of(64, 8192, "bf16", heads=128).tma_tiles
    assert plan_of(64, 8192, "bf16", heads=128, layout="paged").kernel == "wide"
    assert not plan_of(64, 8192, "bf16", heads=128, layout="paged").tma_tiles
    assert not plan_of(64, 8192, "bf16", heads=128, device=DeviceFacts(tensor_maps=False)).tma_tiles
    # fp8 and MXFP4 tiles go through the value warpgroups' registers
    assert not plan_of(64, 8192, "fp8", heads=128).tma_tiles
    assert not plan_of(64, 8192, "mxfp4", heads=128).tma_tiles
    # the narrow kernel's bf16 form and the register-V kernel are TMA forms
    assert plan_of(32, 8192, "bf16").tma_tiles and plan_of(32, 8192, "fp8").tma_tiles
    assert "tma_tiles=True" in str(plan_of(64, 8192, "bf16", heads=128))
    # that form lands Q by TMA too: a query whose token stride a tensor map cannot describe (an
    # expanded view, stride 0 across 4 tokens) keeps the cp.async form; one token (its stride never
    # used) does not stand in the way
    (q, cache, qo), kw = shapes(4, 8192, "bf16", heads=128)
    expanded = torch.empty(1, 128, 576, dtype=torch.bfloat16).expand(4, 128, 576)
    plan = mla_decode.explain(expanded, cache, qo, device=DeviceFacts.h200(), **kw)
    assert plan.kernel == "wide" and not plan.tma_tiles
    assert plan_of(1, 8192, "bf16", heads=128).tma_tiles


def test_other_devices():
    # A100: no Hopper kernel; the mma.sync kernel with its default rings, one CTA per SM (164 KB)
    for fmt in ("bf16", "fp8", "mxfp4"):
        for heads in (16, 128):
            p = plan_of(64, 8192, fmt, heads=heads, device=DeviceFacts.a100())
            assert p.kernel == "mma_sync", str(p)
            assert "sm_90a" in p.rejected["wide"] or "H >= 64" in p.rejected["wide"]
    # a 99 KB device (sm_86 / sm_89 / sm_120): fp8's 5-stage ring (103 KB) does not fit, the 4-stage one does
    small = DeviceFacts(arch=89, sm90a=False, num_sms=128, smem_per_block=101376, smem_per_sm=102400)
    p = plan_of(256, 8192, "fp8", device=small)
    assert (p.kernel, p.stages) == ("mma_sync", 4) and p.smem_bytes <= 101376
    assert plan_of(256, 8192, "fp8").kernel == "narrow_register_v"  # the same call on an H200
    # AMD: the MFMA kernel, up to 128 splits
    p = plan_of(1, 32768, "fp8", device=DeviceFacts.mi300x())
    assert p.kernel == "mfma" and p.splits > 32


def test_forced_kernels():
    p = plan_of(4, 1024, "fp8", overrides={"kernel": "narrow"})
    assert p.kernel == "narrow" and p.error is None and p.why == "forced by the overrides"
    p = plan_of(4, 1024, "bf16", overrides={"kernel": "wide"})
    assert p.error is not None and "H >= 64" in p.error
    p = plan_of(4, 1024, "mxfp4", overrides={"kernel": "narrow_register_v"})
    assert "OCP fp8" in p.error
    p = plan_of(4, 1024, "bf16", heads=128, overrides={"kernel": "mfma"})
    assert "AMD" in p.error
    # forcing the plan's own choice changes nothing but the reason
    auto, forced = plan_of(64, 8192, "bf16", heads=128), plan_of(64, 8192, "bf16", heads=128, overrides={"kernel": "wide"})
    assert (auto.kernel, auto.splits, auto.smem_bytes) == (forced.kernel, forced.splits, forced.smem_bytes)


def test_smem_limit_override_plans_the_99kb_rings():
    p = plan_of(256, 8192, "fp8", overrides={"smem_limit": 101376})
    assert (p.kernel, p.stages, p.smem_limit) == ("mma_sync", 4, 101376)


def test_explain_reads_as_a_sentence():
    p = plan_of(32, 8192, "fp8")
    text = str(p)
    assert text.startswith("narrow_register_v splits=4") and "stream_kv=True" in text and p.why in text
    assert set(p.rejected) == {"mma_sync", "wide", "narrow", "mfma"}
    assert "H >= 64" in p.rejected["wide"]


def test_explain_of_cpu_tensors_describes_the_cpu_kernel():
    args, kw = shapes(2, 64, "bf16")
    p = mla_decode.explain(*args, **kw)
    assert p.kernel.startswith("cpu_"), str(p)
    with pytest.raises(RuntimeError, match="give the GPU's facts"):
        mla_decode.explain(*args, **kw, overrides={"kernel": "wide"})


@pytest.mark.parametrize("overrides,message", [
    ({"kernel": "fast"}, "must name a split kernel"),
    ({"smem_limit": "99KB"}, "smem_limit must be an integer"),
    ({"num_sms": 0}, "num_sms must be an integer in"),
    ({"vendor": "intel"}, "vendor must be 'nvidia' or 'amd'"),
    ({"colour": 1}, "unknown override 'colour'"),
])
def test_bad_overrides_are_clear_errors(overrides, message):
    args, kw = shapes(2, 64, "bf16")
    with pytest.raises(RuntimeError, match=message):
        mla_decode.explain(*args, **kw, device=DeviceFacts.h200(), overrides=overrides)


def test_gpu_overrides_on_cpu_tensors_are_refused():
    args, kw = shapes(2, 64, "bf16")
    with pytest.raises(RuntimeError, match="these tensors are on the CPU"):
        mla_decode.decode(*args, **kw, _overrides={"kernel": "mma_sync"})


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_plan_table_driver_builds_and_agrees_with_explain(tmp_path):
    """scripts/plan_table.cpp (plan_compare.sh's driver) is plain C++ against csrc/plan alone."""
    exe = tmp_path / "plan_table"
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", str(ROOT / "csrc"), str(ROOT / "scripts" / "plan_table.cpp"),
                    str(ROOT / "csrc" / "plan" / "plan.cpp"), "-o", str(exe)], check=True, timeout=300)
    table = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=120).stdout.splitlines()
    assert len(table) == 165888
    line = next(t for t in table if t.startswith("fmt1 lay0 H16 B32 q1 kv8192 req0 sm132 lim232448:"))
    p = plan_of(32, 8192, "fp8")
    assert line.split(": ", 1)[1] == (f"{p.kernel} groups {p.head_groups} splits {p.splits} stages {p.stages} "
                                      f"smem {p.smem_bytes}" + (" stream" if p.stream_kv else ""))


def test_hopper_kernels_never_plan_more_ctas_than_sms():
    """A wide or narrow CTA takes a whole SM, so a planned split count never puts more CTAs than
    SMs on the device (a CTA past the SM count would wait for a whole split of the first wave);
    only a call with more (token, head group) rows than SMs, at one split, has more."""
    seen = set()
    for fmt in ("bf16", "fp8", "mxfp4"):
        for heads in (16, 32, 64, 128):
            for batch in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 33, 64):
                for kv in (1024, 8192, 32768):
                    p = plan_of(batch, kv, fmt, heads=heads)
                    if p.kernel not in ("wide", "narrow", "narrow_register_v"):
                        continue
                    seen.add(p.kernel)
                    ctas = batch * p.head_groups * p.splits
                    assert ctas <= 132 or p.splits == 1, (fmt, heads, batch, kv, str(p))
    assert seen == {"wide", "narrow", "narrow_register_v"}


def test_planned_splits_all_hold_keys():
    """Split s of an item with L keys gets [s chunk, (s + 1) chunk), chunk = ceil(ceil(L / S) / T) T
    for the kernel's tile T (kernels/common/work.cuh): the planned count S never leaves the last
    splits empty (17 splits of 1024 keys by 32 would: chunks of 64, 16 splits with keys), on any
    kernel or device the plan knows."""
    tile = {"mma_sync": 32, "mfma": 32, "wide": 64, "narrow": 64, "narrow_register_v": 64}
    seen = set()
    for device in (DeviceFacts.h200(), DeviceFacts.a100(), DeviceFacts.mi300x()):
        for fmt in ("bf16", "fp8", "mxfp4"):
            for heads in (1, 16, 17, 64, 128):
                for batch in (1, 2, 3, 4, 5, 8, 12, 33):
                    for kv in (1024, 2048, 3000, 8192):
                        p = plan_of(batch, kv, fmt, heads=heads, device=device)
                        seen.add(p.kernel)
                        t = tile[p.kernel]
                        per_split = -(-kv // p.splits)  # ceil
                        chunk = -(-per_split // t) * t
                        assert (p.splits - 1) * chunk < kv, (device, fmt, heads, batch, kv, str(p))
    assert {"mma_sync", "mfma", "wide", "narrow"} <= seen


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4"])
def test_wide_takes_one_tile_splits_on_a_grid_of_at_most_half_the_sms(fmt):
    # H = 128 (two head groups), 2 x 1024: one-tile splits put 64 CTAs on the 132 SMs, against 32
    # with the two-tile minimum (measured 7-11% faster); 4 x 1024 would need 128 CTAs and keeps
    # two tiles a split (8 splits)
    p = plan_of(2, 1024, fmt, heads=128)
    assert (p.kernel, p.splits) == ("wide", 16), str(p)
    assert plan_of(4, 1024, fmt, heads=128).splits == 8
    # 1 x 2048: 32 one-tile splits (64 CTAs), where two tiles gave 16; 2 x 2048 (128 CTAs) keeps 16
    assert plan_of(1, 2048, fmt, heads=128).splits == 32
    assert plan_of(2, 2048, fmt, heads=128).splits == 16
    # 1 x 3072: the one-tile wave (48 splits) is capped at 32, and the tile rounding of 96-key chunks
    # gives 24 splits of two tiles again, as before
    assert plan_of(1, 3072, fmt, heads=128).splits == 24
    # an explicit split count is kept
    assert plan_of(2, 1024, fmt, heads=128, num_splits=8).splits == 8
