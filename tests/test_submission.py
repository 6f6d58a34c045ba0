"""The single-file submission: generated from this checkout, run standalone
(without the package imported) in a subprocess. On a machine without a GPU
it must take the pure-PyTorch path, say so once, and still be right."""

import os
import subprocess
import sys
import textwrap

import torch

from mla_decode.inputs import generate_input
from mla_decode.reference import dequantize_cache, reference_decode
from mla_decode.submission import main as write_submission

RUNNER = textwrap.dedent("""
    import sys, warnings, torch
    sys.path.insert(0, sys.argv[1])
    import submission
    data = torch.load(sys.argv[2], weights_only=False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = submission.custom_kernel(data)
        out2 = submission.custom_kernel(data)
    torch.save(out, sys.argv[3])
    print("WARNINGS", len(rec), [str(w.message) for w in rec])
    print("SAME", torch.equal(out, out2))
    print("NATIVE_LOADED", "mla_decode" in sys.modules)
    print("NATIVE_BUILT", submission._NATIVE, submission._NATIVE_ERROR)
    if submission._NATIVE and torch.cuda.is_available():
        # The plan of a large fp8 call (empty tensors of its shapes: explain reads no values).
        dev = torch.device("cuda")
        q = torch.empty(256, 16, 576, dtype=torch.bfloat16, device=dev)
        kv = torch.empty(256 * 8192, 1, 576, dtype=torch.float8_e4m3fn, device=dev)
        scale = torch.ones(1, device=dev)
        qo = torch.arange(257, dtype=torch.int32, device=dev)
        kvp = torch.arange(257, dtype=torch.int32, device=dev) * 8192
        plan = torch.ops.mla_decode.explain(q, kv, scale, qo, kvp, None, None, None, 1, 1 / 24)
        print("PLAN", plan.replace(chr(10), " "))
""")


def run_submission(tmp_path, data, strict=False, fmt="bf16"):
    """fmt: MLA_DECODE_FORMAT for the run (None: unset, the file's default)."""
    write_submission(["-o", str(tmp_path / "submission.py")])
    torch.save(data, tmp_path / "data.pt")
    env = dict(os.environ)
    # A shared build folder may be named (scripts/verify_submission.py reuses it on the GPU).
    env["MLA_DECODE_CACHE"] = os.environ.get("MLA_DECODE_TEST_SUBMISSION_CACHE", str(tmp_path / "cache"))
    env.pop("PYTHONPATH", None)
    env.pop("MLA_DECODE_FORMAT", None)
    if fmt is not None:
        env["MLA_DECODE_FORMAT"] = fmt
    if strict:
        env["MLA_DECODE_STRICT"] = "1"
    else:
        env.pop("MLA_DECODE_STRICT", None)
    return subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path), str(tmp_path / "data.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=1800)


def test_submission_runs_standalone_and_matches_reference(tmp_path):
    data = generate_input(3, 2, 100, seed=11, device="cpu")
    res = run_submission(tmp_path, data)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "NATIVE_LOADED False" in res.stdout and "SAME True" in res.stdout
    if not torch.cuda.is_available():
        # One warning for two calls, naming the reason.
        assert "WARNINGS 1" in res.stdout and "no GPU is visible" in res.stdout, res.stdout
    q, kv, qo, kvp, cfg = data
    ref, _ = reference_decode(q, dequantize_cache(kv["bf16"]), qo, cfg["sm_scale"], kv_indptr=kvp)
    out = torch.load(tmp_path / "out.pt")
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < 8e-3, rel


def test_submission_strict_mode_refuses_the_fallback(tmp_path):
    if torch.cuda.is_available():
        return  # on a GPU machine the native path runs; nothing to refuse
    res = run_submission(tmp_path, generate_input(1, 1, 16, seed=1, device="cpu"), strict=True)
    assert res.returncode != 0
    assert "MLA_DECODE_STRICT=1" in res.stderr and "no GPU is visible" in res.stderr


def test_submission_default_format_matches_the_package(tmp_path):
    """Unset MLA_DECODE_FORMAT: the file uses the package's default (fp8). On a GPU that is the
    native fp8 path, checked against exact math on the dequantised fp8 cache; without one, the
    pure-PyTorch fallback on the bf16 cache."""
    from mla_decode.competition import DEFAULT_FORMAT
    data = generate_input(2, 1, 300, seed=5, device="cpu")
    res = run_submission(tmp_path, data, fmt=None)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"MLA_DECODE_FORMAT\", {DEFAULT_FORMAT!r}" in (tmp_path / "submission.py").read_text()
    q, kv, qo, kvp, cfg = data
    if torch.cuda.is_available():
        # A failed build falls back to PyTorch on the bf16 cache (with a warning): not this case.
        assert "NATIVE_BUILT True" in res.stdout, res.stdout[-3000:]
        if torch.cuda.get_device_capability() == (9, 0) and torch.version.hip is None:
            # The file's build has the Hopper kernels (sm_90a), not only mma.sync (sm_90).
            assert "kernel=narrow_register_v" in res.stdout, res.stdout[-3000:]
        cache, scale = (kv["bf16"], None) if DEFAULT_FORMAT == "bf16" else kv[DEFAULT_FORMAT]
    else:
        cache, scale = kv["bf16"], None
    ref, _ = reference_decode(q, dequantize_cache(cache, scale), qo, cfg["sm_scale"], kv_indptr=kvp)
    out = torch.load(tmp_path / "out.pt")
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < 8e-3, rel


def test_output_folders_are_created(tmp_path):
    target = tmp_path / "some" / "dir" / "file.py"
    assert write_submission(["-o", str(target)]) == 0
    assert target.is_file() and "def custom_kernel(data)" in target.read_text()


def test_check_runs_on_the_file_alone(tmp_path):
    """`python submission.py --check`: the package's built-in check on the file's own custom_kernel
    (and, on a GPU, its operator), in a process that never imports mla_decode."""
    target = tmp_path / "x" / "y.py"
    write_submission(["-o", str(target)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLA_DECODE_FORMAT", "MLA_DECODE_STRICT")}
    env["MLA_DECODE_CACHE"] = os.environ.get("MLA_DECODE_TEST_SUBMISSION_CACHE", str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(target), "--check"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "mla_decode imported: False" in res.stdout
    assert " failed" in res.stdout and "checks passed, 0 failed" in res.stdout, res.stdout[-2000:]
    if torch.cuda.is_available():
        assert "native operator built" in res.stdout and " op  " in res.stdout


def test_bad_root_is_named(tmp_path, capsys):
    import pytest
    with pytest.raises(SystemExit):
        write_submission(["-o", str(tmp_path / "s.py"), "--root", str(tmp_path)])
    assert "expected a folder holding csrc/" in capsys.readouterr().err


def test_embedded_sources_are_the_operators_own():
    """The file's build compiles every embedded .cpp / .cu into one library, so the stand-alone tool
    programs (csrc/**/tools/, each with a main()) must not be embedded (two mains broke the build on
    GPU machines, where the file then fell back to PyTorch), and every translation unit of the
    package's own CPU build must be."""
    from pathlib import Path

    from mla_decode.submission import collect_sources
    root = Path(__file__).resolve().parent.parent
    sources = collect_sources(root)
    units = {rel: text for rel, text in sources.items() if rel.endswith((".cpp", ".cu"))}
    assert not [rel for rel in units if "/tools/" in rel]
    assert not [rel for rel, text in units.items() if "int main(" in text]
    package_cpu = {p.relative_to(root).as_posix() for d in ("api", "plan", "cpu") for p in (root / "csrc" / d).glob("*.cpp")}
    assert package_cpu <= set(units), sorted(package_cpu - set(units))


def test_hopper_builds_ask_for_sm90a(tmp_path, monkeypatch):
    """The file's build on a compute capability 9.0 GPU: sm_90a code and -DMLA_DECODE_SM90A, whatever
    the environment's TORCH_CUDA_ARCH_LIST says of 9.0 (torch's default for the device, "9.0",
    builds sm_90 code, which has only the mma.sync kernel; "9.0a" without the define compiles the
    Hopper kernels out); other GPUs and lists build as torch would. Run on the CPU with the device
    facts patched."""
    import importlib.util
    target = tmp_path / "submission_archs.py"
    write_submission(["-o", str(target)])
    spec = importlib.util.spec_from_file_location("submission_archs", target)
    sub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sub)
    monkeypatch.setattr(sub.torch.version, "hip", None)
    monkeypatch.setattr(sub.torch.version, "cuda", "13.0")
    cap = {"value": (9, 0)}
    monkeypatch.setattr(sub.torch.cuda, "get_device_capability", lambda *a: cap["value"])
    cases = {None: ("9.0a", ["-DMLA_DECODE_SM90A"]), "9.0": ("9.0a", ["-DMLA_DECODE_SM90A"]),
             "8.0;9.0+PTX": ("8.0;9.0a", ["-DMLA_DECODE_SM90A"]), "9.0a": (None, ["-DMLA_DECODE_SM90A"]),
             "8.0 9.0a": (None, ["-DMLA_DECODE_SM90A"]), "8.0": (None, [])}
    for env, expected in cases.items():
        if env is None:
            monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
        else:
            monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", env)
        assert sub._cuda_archs() == expected, env
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    cap["value"] = (8, 0)
    assert sub._cuda_archs() == (None, [])
    cap["value"] = (9, 0)
    monkeypatch.setattr(sub.torch.version, "cuda", "11.8")  # no sm_90a before CUDA 12
    assert sub._cuda_archs() == (None, [])
