"""The kernel switches MLA_DECODE_{BF16,FP8,MXFP4}_KERNEL, read by the CUDA layer's host code,
checked without a GPU: scripts/plan_harness/switch_table.cu is built with nvcc against csrc/cuda
and run under each value. Skipped where nvcc is not installed."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
VARS = ("MLA_DECODE_BF16_KERNEL", "MLA_DECODE_FP8_KERNEL", "MLA_DECODE_MXFP4_KERNEL")
# KernelSwitch (decode_common.h): kByPlan, kMma, kWide, kNarrow, kWgmma
BY_PLAN, MMA, WIDE, NARROW, WGMMA = range(5)


@pytest.fixture(scope="module")
def switch_table(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA host code is not built here")
    exe = tmp_path_factory.mktemp("switches") / "switch_table"
    sources = sorted(str(p) for p in (ROOT / "csrc" / "cuda").glob("*.cu")) + \
        sorted(str(p) for p in (ROOT / "csrc" / "cuda" / "sm90").glob("*.cu"))
    # PTX only (no ptxas): only the host code runs.
    cmd = [NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=compute_90a",
           "-DMLA_DECODE_SM90A", "-I", str(ROOT / "csrc"), str(ROOT / "scripts" / "plan_harness" / "switch_table.cu"),
           *sources, "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]

    def run(**env_vars):
        env = {k: v for k, v in os.environ.items() if k not in VARS}
        env.update(env_vars)
        out = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        table = {}
        for line in out.splitlines():
            name, *fields = line.split()
            table[name] = {k: int(v) for k, v in (f.split("=") for f in fields)}
        return table

    return run


@pytest.mark.parametrize("value,switch", [(None, BY_PLAN), ("mma", MMA), ("wide", WIDE), ("narrow", NARROW),
                                          ("wgmma", WGMMA), ("MMA", BY_PLAN), ("", BY_PLAN)])
def test_each_value_is_read_as_documented(switch_table, value, switch):
    table = switch_table(**({} if value is None else {v: value for v in VARS}))
    for fmt in ("bf16", "fp8", "mxfp4"):
        assert table[fmt]["switch"] == switch, (fmt, value, table[fmt])
        assert table[fmt]["wide_forced"] == (1 if value == "wide" else 0), (fmt, value)
        narrow = value == "narrow"  # bf16 too (session 16: TMA-landed tiles, indptr layout)
        assert table[fmt]["narrow_forced"] == (1 if narrow else 0), (fmt, value)
    # e4m3fnuz (an AMD format) has no switch and no Hopper kernel.
    assert table["fp8_fnuz"] == {"switch": BY_PLAN, "wide_forced": 0, "narrow_forced": 0}


def test_each_format_reads_its_own_variable(switch_table):
    table = switch_table(MLA_DECODE_BF16_KERNEL="wide", MLA_DECODE_FP8_KERNEL="narrow", MLA_DECODE_MXFP4_KERNEL="mma")
    assert table["bf16"] == {"switch": WIDE, "wide_forced": 1, "narrow_forced": 0}
    assert table["fp8"] == {"switch": NARROW, "wide_forced": 0, "narrow_forced": 1}
    assert table["mxfp4"] == {"switch": MMA, "wide_forced": 0, "narrow_forced": 0}


# The kernel the plan picks at each competition shape (H = 16, q_len 1, indptr layout) on an
# H200-like device (132 SMs, 227 KB per block), as measured (docs/performance.md: the narrow
# kernel for MXFP4 from run91, fp8's register-V form from run117, bf16's TMA form from run128,
# and from session 17 (run138) bf16's TMA form with the L2 stream hint at the small shapes).
# "+stream": the TMA tile loads take the L2 evict_first policy (caches of at most 3x L2).
# A planning change that moves one of these must come with a measurement.
COMPETITION_KERNELS = {
    "bf16": {(4, 1024): "mma", (4, 8192): "narrow+stream", (32, 1024): "narrow+stream", (32, 8192): "narrow",
             (64, 1024): "narrow+stream", (64, 8192): "narrow", (256, 1024): "mma", (256, 8192): "narrow"},
    "fp8": {(4, 1024): "mma", (4, 8192): "mma", (32, 1024): "mma", (32, 8192): "narrow+stream",
            (64, 1024): "narrow+stream", (64, 8192): "narrow", (256, 1024): "narrow+stream", (256, 8192): "narrow"},
    "mxfp4": {(4, 1024): "mma", (4, 8192): "narrow", (32, 1024): "narrow", (32, 8192): "narrow",
              (64, 1024): "narrow", (64, 8192): "narrow", (256, 1024): "narrow", (256, 8192): "narrow"},
}


# Around the L2 stream hint's threshold (caches of at most 3 x 50 MiB on the harness's device):
# bf16 8 x 32768 (302 MB) and fp8 32 x 32768 (604 MB) go without it, fp8 8 x 32768 (151 MB) takes it.
LARGE_CACHE_KERNELS = {
    "bf16": {(8, 32768): "narrow"},
    "fp8": {(8, 32768): "narrow+stream", (32, 32768): "narrow"},
}


def test_competition_shapes_take_the_measured_kernels(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA host code is not built here")
    exe = tmp_path / "plan_table"
    cmd = [NVCC, "-std=c++17", "-I", str(ROOT / "csrc"), str(ROOT / "scripts" / "plan_harness" / "plan_table.cu"),
           "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    table = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    fmt_ids = {"bf16": 0, "fp8": 1, "mxfp4": 3}  # KvFormat values
    expected = [(fmt, shape, kernel) for table_ in (COMPETITION_KERNELS, LARGE_CACHE_KERNELS)
                for fmt, kernels in table_.items() for shape, kernel in kernels.items()]
    for fmt, (batch, kv), kernel in expected:
        key = f"fmt{fmt_ids[fmt]} lay0 H16 B{batch} q1 kv{kv} req0 sm132 lim232448:"
        lines = [line for line in table.splitlines() if line.startswith(key)]
        assert len(lines) == 1, (key, lines)
        fields = lines[0].split(":")[1].split()
        planned = fields[0] + ("+stream" if fields[-1] == "stream" else "")
        assert planned == kernel, (fmt, batch, kv, lines[0])
