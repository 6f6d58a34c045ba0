"""The GPU dispatcher (csrc/api/dispatch_cuda.cpp) compiles against this torch's headers and the
CUDA runtime's, on machines without a GPU or a CUDA build of torch: CI would otherwise compile it
only where a GPU build happens. (The kernels' translation units are compiled by
scripts/check_cuda_compile.sh; the HIP ones by scripts/hip_check.sh.)"""
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

ROOT = Path(__file__).resolve().parent.parent


def _cuda_include():
    """The CUDA toolkit's include folder: CUDA_HOME's, or next to nvcc, or /usr/local/cuda's."""
    from torch.utils.cpp_extension import CUDA_HOME
    candidates = [Path(CUDA_HOME) / "include"] if CUDA_HOME else []
    if shutil.which("nvcc"):
        candidates.append(Path(shutil.which("nvcc")).resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda_runtime.h").exists()), None)


@pytest.mark.skipif(_cuda_include() is None or shutil.which("g++") is None,
                    reason="no CUDA toolkit headers (nvcc) or g++ on this machine")
def test_gpu_dispatcher_compiles(tmp_path):
    # A CPU build of torch ships c10/cuda's headers but not the one CMake generates for CUDA builds.
    stub = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stub.parent.mkdir(parents=True)
    stub.write_text("#pragma once\n")
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-DMLA_DECODE_WITH_CUDA", *[f"-I{p}" for p in include_paths()],
           f"-I{sysconfig.get_paths()['include']}", f"-I{_cuda_include()}", f"-I{tmp_path}", f"-I{ROOT / 'csrc'}",
           str(ROOT / "csrc" / "api" / "dispatch_cuda.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
