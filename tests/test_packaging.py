"""Version and build information, and a clear error (not a crash) when the
native library was built against another torch."""

import os
import shutil
import subprocess
import sys
import textwrap

import torch

import mla_decode


def test_version_names_torch_and_backend():
    v = mla_decode.__version__
    base = torch.__version__.split("+")[0]
    assert v.startswith("0.1.0+torch" + base + "."), v
    info = mla_decode.info()
    assert info["native"] and info["built_with"]["torch"] == torch.__version__
    assert info["compiled_backends"].split(",")[0] == "cpu"


def test_other_torch_gives_a_clear_error(tmp_path):
    pkg = os.path.dirname(mla_decode.__file__)
    dst = tmp_path / "mla_decode"
    shutil.copytree(pkg, dst, ignore=shutil.ignore_patterns("__pycache__"))
    info = (dst / "_build_info.py").read_text().replace(f"TORCH_VERSION = {torch.__version__!r}",
                                                       "TORCH_VERSION = '1.0.0+cpu'")
    (dst / "_build_info.py").write_text(info)
    code = textwrap.dedent("""
        import warnings, torch, mla_decode
        from mla_decode.inputs import generate_input
        print("ERR", mla_decode.info()["load_error"])
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            out = mla_decode.custom_kernel(generate_input(1, 1, 32, seed=0, device="cpu"))
        print("OUT", tuple(out.shape), any("falling back" in str(w.message) for w in rec))
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("MLA_DECODE_STRICT", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert "built against torch 1.0.0+cpu" in res.stdout and "not loaded" in res.stdout, res.stdout
    assert "OUT (1, 16, 512) True" in res.stdout, res.stdout


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sdist_carries_what_a_build_and_the_tests_need(tmp_path):
    """MANIFEST.in: the sources, the package, tests, benchmark, examples, scripts and docs; no
    build products."""
    import tarfile
    res = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (tarball,) = tmp_path.glob("mla_decode-*.tar.gz")
    with tarfile.open(tarball) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for need in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "csrc/api/schema.cpp",
                 "csrc/kernels/sm90/narrow_kernel.cuh", "mla_decode/bench/__init__.py", "mla_decode/selfcheck.py",
                 "tests/conftest.py", "benchmarks/bench_decode.py", "scripts/test.sh"):
        assert need in names, f"{need} is missing from the sdist"
    for name in names:
        assert not name.endswith((".so", ".o", ".pyc")) and not name.startswith("build/"), name
        assert name != "mla_decode/_build_info.py", "the sdist must not carry a build's _build_info.py"
