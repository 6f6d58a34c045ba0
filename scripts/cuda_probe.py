"""Builds a probe source of scripts/ (NAME.cu, exporting extern "C" functions) into a shared library
for sm_90a with nvcc ($CUDA_HOME/bin/nvcc) and loads it: the build step of wgmma_probe.py and
tma_qk_probe.py."""
import ctypes
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def load_probe(name: str) -> ctypes.CDLL:
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    lib = os.path.join(tempfile.mkdtemp(), f"{name}.so")
    subprocess.run([nvcc, "-std=c++17", "-O2", "-gencode=arch=compute_90a,code=sm_90a", "-Xcompiler", "-fPIC",
                    "-shared", os.path.join(HERE, f"{name}.cu"), "-o", lib], check=True)
    return ctypes.CDLL(lib)
