"""The CPU kernel's measurement tool (csrc/cpu/tools/piece_bench.cpp, outside the extension)
builds against the current kernel sources and runs: the figures of docs/cpu-kernel.md come from
it, so it must not rot while the kernels change."""
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["csrc/cpu/tools/piece_bench.cpp", "csrc/cpu/kernel_amx.cpp", "csrc/cpu/kernel_avx512.cpp",
           "csrc/cpu/kernel_avx2.cpp", "csrc/cpu/kernel_scalar.cpp", "csrc/cpu/cpu_features.cpp"]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or platform.machine() not in ("x86_64", "AMD64"),
                                reason="piece_bench needs g++ on x86-64")


def _cpu_flags():
    """The CPU's flags from /proc/cpuinfo, None where there are none to read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def _has_avx2():
    return "avx2" in (_cpu_flags() or ())


@pytest.fixture(scope="module")
def piece_bench(tmp_path_factory):
    exe = tmp_path_factory.mktemp("piece_bench") / "piece_bench"
    cmd = ["g++", "-O1", "-std=c++17", f"-I{ROOT / 'csrc'}", "-o", str(exe), *[str(ROOT / s) for s in SOURCES]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


@pytest.mark.skipif(not _has_avx2(), reason="the CPU lacks AVX2")
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_piece_bench_runs(piece_bench, fmt):
    proc = subprocess.run([str(piece_bench), "avx2", fmt, "20", "200", "3", "8"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"avx2 (\w+) H=20 keys=200 groups=2 items=\d+ calls=3: \d+ ticks per call, ([\d.]+) per key, "
                  r"([\d.]+) per key and group \(check ([-\d.e+]+)\)", proc.stdout)
    assert m, proc.stdout
    assert m.group(1) == fmt
    assert float(m.group(2)) > 0 and abs(float(m.group(3)) * 2 - float(m.group(2))) < 0.2
    assert float(m.group(4)) > 0  # the row sums of the last call: positive, finite


def test_piece_bench_scalar_path_and_its_plain_lanes(piece_bench, tmp_path):
    """The scalar path runs on any CPU; built with MLA_CPU_PLAIN_V4 (its four lanes a plain struct,
    as for a compiler without vector extensions) it computes the same sums."""
    plain = tmp_path / "piece_bench_plain_v4"
    cmd = ["g++", "-O1", "-std=c++17", "-DMLA_CPU_PLAIN_V4", f"-I{ROOT / 'csrc'}", "-o", str(plain),
           *[str(ROOT / s) for s in SOURCES]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    checks = []
    for exe in (piece_bench, plain):
        for fmt, heads in (("bf16", "20"), ("fp8", "2"), ("mxfp4", "7")):
            proc = subprocess.run([str(exe), "scalar", fmt, heads, "100", "2", "4"], capture_output=True, text=True,
                                  timeout=120)
            assert proc.returncode == 0, proc.stderr
            m = re.search(rf"scalar {fmt} H={heads} keys=100 groups=\d+ items=\d+ calls=2: .*\(check ([-\d.e+]+)\)",
                          proc.stdout)
            assert m, proc.stdout
            assert float(m.group(1)) > 0
            checks.append(m.group(1))
    assert checks[:3] == checks[3:]


@pytest.mark.parametrize("args,why", [(["avx2", "bf16", "0", "16"], "H must be 1..128"),
                                      (["sse", "bf16", "16", "16"], "PATH must be"),
                                      (["avx2", "int8", "16", "16"], "FORMAT must be"),
                                      (["avx2"], "too few arguments")])
def test_piece_bench_refuses_bad_arguments(piece_bench, args, why):
    proc = subprocess.run([str(piece_bench), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert why in proc.stderr


_PATH_FLAGS = {"amx": {"amx_bf16", "amx_tile", "avx512_bf16"}, "avx512": {"avx512_bf16", "avx512f", "avx512bw"},
               "avx512_fp32": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx2": {"avx2", "fma"}}


@pytest.mark.parametrize("path", sorted(_PATH_FLAGS))
def test_piece_bench_refuses_a_path_the_cpu_lacks(piece_bench, path):
    """A path whose instructions this CPU lacks is refused with the reason (exit 3), not run into
    SIGILL."""
    flags = _cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags")
    if _PATH_FLAGS[path] <= flags:
        pytest.skip(f"this CPU has the {path} path")
    proc = subprocess.run([str(piece_bench), path, "bf16", "16", "64", "2", "1"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "this CPU lacks" in proc.stderr


@pytest.mark.skipif(not _has_avx2() or shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs AVX2 and a git checkout")
def test_cpu_ab_runs_the_checkout():
    """scripts/cpu_ab.py (the A/B of docs/cpu-kernel.md's AMX changes) builds and runs a
    revision and prints its row."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_ab.py"), "WORKTREE", "--path", "avx2",
                           "--shapes", "16,100,mxfp4", "--rounds", "1", "--rotate-mb", "4"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"H= 16 keys=  100 mxfp4: WORKTREE [\d.]+ \(\d+\) x1\.00", proc.stdout), proc.stdout


@pytest.mark.skipif(not _has_avx2() or shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs AVX2 and a git checkout")
def test_cpu_ab_own_harness_builds_each_revision_with_its_harness():
    """--own-harness compiles a revision's own piece_bench.cpp (for A/Bs across a change of the
    kernel contract that the checkout's harness follows)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_ab.py"), "HEAD", "WORKTREE", "--own-harness",
                           "--path", "avx2", "--shapes", "16,100,bf16", "--rounds", "1", "--rotate-mb", "4"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"H= 16 keys=  100  bf16: HEAD [\d.]+ \(\d+\) x1\.00   WORKTREE [\d.]+ \(\d+\) x[\d.]+",
                     proc.stdout), proc.stdout


@pytest.mark.skipif(not _has_avx2(), reason="needs AVX2")
def test_cpu_ab_takes_an_exported_tree(tmp_path):
    """A revision may be a directory holding a csrc/ tree (what a machine whose copy of the checkout
    has no .git is given); it is built from that directory's sources."""
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_ab.py"), str(tmp_path), "--path", "avx2",
                           "--shapes", "16,100,fp8", "--rounds", "1", "--rotate-mb", "4"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"H= 16 keys=  100   fp8: " + re.escape(str(tmp_path)) + r" [\d.]+ \(\d+\) x1\.00",
                     proc.stdout), proc.stdout
