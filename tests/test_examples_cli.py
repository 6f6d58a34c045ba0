"""The example and the command line run end to end (CPU here, GPU on a GPU machine)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=600):
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


def test_deepseek_decode_step_example():
    out = run("examples/deepseek_decode_step.py")
    assert "all checks passed" in out and "FAIL" not in out


def test_cli_info_and_check():
    assert '"native": true' in run("-m", "mla_decode", "info")
    assert "checks passed" in run("-m", "mla_decode", "check")


def test_cli_bench_quick(tmp_path):
    out = run("-m", "mla_decode", "bench", "--quick", "--skip-sweep", "--out", str(tmp_path))
    assert "SUMMARY" in out
    assert (tmp_path / "competition.csv").exists()
