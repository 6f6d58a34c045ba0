"""The wheel as a new user meets it: built from this checkout, installed into a fresh virtual
environment holding only torch, and run from a folder outside the repository: `python -m
mla_decode info`, `check`, `bench --quick` and `python -m mla_decode.submission -o x/y.py`, then
the generated file's own check in a process that never imports mla_decode.

The wheel build reuses the objects of the checkout's own build (setup.py's persistent object
folder), so it links rather than compiles when the tree was built already. torch comes from
the package index pip is configured with; where that cannot serve it (a machine without
network), the test is skipped outside CI and fails in CI.
"""

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
TORCH_RELEASE = torch.__version__.split("+")[0]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MLA_DECODE_FORMAT", "MLA_DECODE_STRICT", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(cmd, cwd, timeout=900, env=None, check=True):
    t0 = time.time()
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=env or _env())
    res.seconds = time.time() - t0
    if check:
        assert res.returncode == 0, f"{' '.join(map(str, cmd))} exited {res.returncode}:\n" \
                                    f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(venv python, wheel path, a work folder outside the repository, timings)."""
    base = tmp_path_factory.mktemp("wheel")
    timings = {}
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=base)
    py = venv / "bin" / "python"
    # Bounded retries: on a machine without network the answer comes quickly.
    res = _run([py, "-m", "pip", "install", "-q", "--retries", "1", "--timeout", "30", f"torch=={TORCH_RELEASE}"],
               cwd=base, check=False, timeout=1200)
    if res.returncode != 0:
        msg = f"cannot install torch=={TORCH_RELEASE} into a fresh venv: {res.stderr.strip().splitlines()[-1:]}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    timings["venv_and_torch_s"] = res.seconds
    dist = base / "dist"
    res = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", dist, ROOT],
               cwd=base, env=_env(MAX_JOBS=os.environ.get("MAX_JOBS", "2")), timeout=3600)
    timings["wheel_build_s"] = res.seconds
    (wheel,) = dist.glob("mla_decode-*.whl")
    res = _run([py, "-m", "pip", "install", "-q", wheel], cwd=base)
    timings["wheel_install_s"] = res.seconds
    work = base / "user"
    work.mkdir()
    yield py, wheel, work, timings
    print(f"\nwheel test timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")


def test_wheel_contents(wheel_env):
    _, wheel, _, _ = wheel_env
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert any(n.startswith("mla_decode/_C") and n.endswith(".so") for n in names)
    for need in ("mla_decode/_build_info.py", "mla_decode/selfcheck.py", "mla_decode/bench/__init__.py",
                 "mla_decode/_sources/csrc/api/schema.cpp", "mla_decode/_sources/csrc/kernels/sm90/narrow_kernel.cuh"):
        assert need in names, f"{need} is missing from the wheel"
    assert f"Requires-Dist: torch=={TORCH_RELEASE}" in meta


def test_installed_package_is_the_wheels(wheel_env):
    py, _, work, _ = wheel_env
    res = _run([py, "-c", "import mla_decode; print(mla_decode.__file__)"], cwd=work)
    assert str(py.parent.parent) in res.stdout and str(ROOT) not in res.stdout, res.stdout
    info = json.loads(_run([py, "-m", "mla_decode", "info"], cwd=work).stdout)
    assert info["native"] is True and info["built_with"]["torch"].split("+")[0] == TORCH_RELEASE, info


def test_check(wheel_env):
    py, _, work, timings = wheel_env
    res = _run([py, "-m", "mla_decode", "check"], cwd=work)
    timings["check_s"] = res.seconds
    assert "checks passed, 0 failed" in res.stdout, res.stdout[-2000:]


def test_bench_quick(wheel_env):
    py, _, work, timings = wheel_env
    res = _run([py, "-m", "mla_decode", "bench", "--quick", "--out", work / "bench"], cwd=work)
    timings["bench_quick_s"] = res.seconds
    assert "SUMMARY" in res.stdout, res.stdout[-2000:]
    helped = _run([py, "-m", "mla_decode", "bench", "--help"], cwd=work).stdout
    for flag in ("--sustained", "--window-ms", "--gap-s", "--flush-mb", "--peers", "--cpu-smoke", "--sweep-heads"):
        assert flag in helped


def test_submission_and_its_check(wheel_env):
    py, _, work, timings = wheel_env
    res = _run([py, "-m", "mla_decode.submission", "-o", "x/y.py"], cwd=work)
    target = work / "x" / "y.py"
    assert target.is_file(), res.stdout
    # The generated file's check runs in a process that never imports mla_decode (it says so).
    res = _run([py, target, "--check"], cwd=work, env=_env(MLA_DECODE_CACHE=str(work / "cache")), timeout=3600)
    timings["submission_check_s"] = res.seconds
    assert "checks passed, 0 failed" in res.stdout and "mla_decode imported: False" in res.stdout, res.stdout[-2000:]
