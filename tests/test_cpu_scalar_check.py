"""The portable CPU path against float64 without torch (csrc/cpu/tools/scalar_check.cpp): built
with the host compiler and run, and, where a cross compiler and qemu-aarch64 are installed,
built for AArch64 (NEON code, FMA contraction) and run under qemu. The harness poisons the
piece's outputs, covers every QK form and PV's row tail, partial blocks, q_len > 1 and a
group that sees no key, and holds the path to fp32's error bound (1e-4)."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "csrc" / "cpu" / "tools" / "scalar_check.cpp", ROOT / "csrc" / "cpu" / "kernel_scalar.cpp"]


def build_and_run(compiler, exe, runner=()):
    cmd = [compiler, "-O2", "-std=c++17", f"-I{ROOT / 'csrc'}", "-o", str(exe), *map(str, SOURCES)]
    if runner:
        cmd.insert(1, "-static")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "scalar_check: 30 cases, 0 failed" in proc.stdout, proc.stdout[-2000:]
    assert proc.stdout.count("\nok ") + proc.stdout.startswith("ok ") == 30


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_scalar_path_matches_float64_on_this_cpu(tmp_path):
    build_and_run("g++", tmp_path / "scalar_check")


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user)")
def test_scalar_path_matches_float64_on_aarch64_under_qemu(tmp_path):
    build_and_run("aarch64-linux-gnu-g++", tmp_path / "scalar_check_aarch64", runner=("qemu-aarch64",))
