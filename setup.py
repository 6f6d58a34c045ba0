"""Build script for mla_decode.

Builds against the torch that is already installed:

    pip install --no-build-isolation -e .           # editable, from this checkout
    pip wheel --no-build-isolation --no-deps .      # a wheel for this torch

Every build (editable, wheel, build_ext --inplace) compiles its objects into one
persistent folder per toolchain, build/obj-<tag>, with ninja: an unchanged source
is never compiled twice, and a changed one recompiles only the translation units
that include it. A wheel carries, besides the extension and the Python package,
the C++/CUDA/HIP sources under mla_decode/_sources/ (the single-file submission
generator embeds them) and pins the torch release it was built against.

What gets compiled follows the toolchain, never whether a GPU is visible:
  * the C++ CPU operators, always;
  * the CUDA kernels when torch is a CUDA build and nvcc is found (CUDA_HOME);
  * the HIP kernels (hipified from the same sources) when torch is a ROCm build.

Environment flags:
  MLA_DECODE_CUDA=0|1   skip / require the CUDA kernels (default: build if possible)
  MLA_DECODE_HIP=0|1    skip / require the HIP kernels (default: build if possible)
  MLA_DECODE_DEBUG=1    -O0 -g, device line info
  TORCH_CUDA_ARCH_LIST  CUDA archs (default "8.0;9.0a": mma.sync needs sm_80+)
  PYTORCH_ROCM_ARCH     AMD archs (default "gfx942")
  MAX_JOBS              parallel compile jobs (ninja)
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fail(msg: str) -> None:
    sys.stderr.write(f"\nmla_decode build error: {msg}\n\n")
    raise SystemExit(1)


def env_flag(name: str):
    """None when unset, else True/False."""
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    fail(f"{name}={v!r} is not understood; use 0 or 1.")


try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    fail("torch is not installed. Install torch first (pip install torch), then build with "
         "`pip install --no-build-isolation -e .` so the extension matches that torch.")


def nvcc_version(cuda_home):
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    try:
        out = subprocess.check_output([str(nvcc), "--version"], text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


# Lowest nvcc release that knows each arch we may be asked for.
_MIN_NVCC_FOR_ARCH = {"8.0": (11, 0), "8.6": (11, 1), "8.9": (11, 8), "9.0": (11, 8), "9.0a": (12, 0),
                      "10.0": (12, 8), "10.0a": (12, 8), "12.0": (12, 8)}


def choose_backend():
    want_cuda = env_flag("MLA_DECODE_CUDA")
    want_hip = env_flag("MLA_DECODE_HIP")
    is_rocm_torch = torch.version.hip is not None
    is_cuda_torch = torch.version.cuda is not None

    if want_cuda and want_hip:
        fail("MLA_DECODE_CUDA=1 and MLA_DECODE_HIP=1 were both set; one build targets one vendor.")
    if want_hip:
        if not is_rocm_torch:
            fail(f"MLA_DECODE_HIP=1 but this torch ({torch.__version__}) is not a ROCm build. Install a ROCm "
                 "build of torch, or unset MLA_DECODE_HIP.")
        return "hip"
    if want_cuda:
        if not is_cuda_torch:
            fail(f"MLA_DECODE_CUDA=1 but this torch ({torch.__version__}) is not a CUDA build. Install a CUDA "
                 "build of torch, or unset MLA_DECODE_CUDA.")
        if cpp_extension.CUDA_HOME is None:
            fail("MLA_DECODE_CUDA=1 but nvcc was not found. Set CUDA_HOME to a CUDA toolkit whose major version "
                 f"matches torch's CUDA {torch.version.cuda}, or unset MLA_DECODE_CUDA.")
        return "cuda"
    if is_rocm_torch and want_hip is not False and cpp_extension.ROCM_HOME is not None:
        return "hip"
    if is_cuda_torch and want_cuda is not False and cpp_extension.CUDA_HOME is not None:
        return "cuda"
    return "cpu"


def check_cuda_archs():
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs:
        archs = "8.0;9.0a"
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    ver = nvcc_version(cpp_extension.CUDA_HOME)
    for a in re.split(r"[;\s,]+", archs.strip()):
        a = a.replace("+PTX", "")
        if not a:
            continue
        base = float(re.match(r"\d+\.\d+", a).group(0)) if re.match(r"\d+\.\d+", a) else None
        if base is not None and base < 8.0:
            fail(f"TORCH_CUDA_ARCH_LIST contains {a}, but the kernels use mma.sync bf16 tensor cores, which need "
                 "compute capability 8.0 or newer. Remove it (or build CPU-only with MLA_DECODE_CUDA=0).")
        need = _MIN_NVCC_FOR_ARCH.get(a)
        if ver is not None and need is not None and ver < need:
            fail(f"nvcc {ver[0]}.{ver[1]} cannot compile for arch {a} (needs nvcc {need[0]}.{need[1]} or newer). "
                 "Install a newer CUDA toolkit or remove that arch from TORCH_CUDA_ARCH_LIST.")
    return archs


# AMD targets the HIP kernels support (wave64, MFMA; docs/amd.md): gfx90a (MI200,
# bf16 MFMA, fp8 decoded in software), gfx942 (MI300, bf16 and fp8 MFMA) and
# gfx950 (MI355X: the scaled f8f6f4 MFMA for fp8 and MXFP4, 16x16x32 bf16;
# needs a compiler with those builtins, ROCm 7 / LLVM 20 or later).
_ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950")


def check_rocm_archs():
    archs = os.environ.get("PYTORCH_ROCM_ARCH")
    if not archs:
        archs = "gfx942"
        os.environ["PYTORCH_ROCM_ARCH"] = archs
    for a in re.split(r"[;\s,]+", archs.strip()):
        if a and a.split(":")[0] not in _ROCM_ARCHS:
            fail(f"PYTORCH_ROCM_ARCH contains {a}, but the HIP kernels need bf16 MFMA and 64-lane wavefronts "
                 f"(CDNA2/3/4: {', '.join(_ROCM_ARCHS)}). Remove it (or build CPU-only with MLA_DECODE_HIP=0).")
    return archs


def build_extension():
    backend = choose_backend()
    debug = env_flag("MLA_DECODE_DEBUG") is True
    cxx_flags = ["-O0", "-g"] if debug else ["-O3"]
    cxx_flags += ["-std=c++17", "-DMLA_DECODE_BUILD"]
    # at::parallel_for of an OpenMP build of ATen is an inline `#pragma omp parallel`: without
    # -fopenmp the CPU kernel would run every piece on the calling thread.
    link_flags = []
    if torch.backends.openmp.is_available():
        cxx_flags.append("-fopenmp")
        link_flags.append("-fopenmp")
    # Host C++ of every build: the operators (csrc/api, but the GPU dispatcher),
    # the plan (csrc/plan: plain C++, so the CPU build tests it) and the CPU kernel.
    sources = sorted(rel(p) for p in (CSRC / "api").glob("*.cpp") if p.name != "dispatch_cuda.cpp")
    sources += sorted(rel(p) for d in ("plan", "cpu") for p in (CSRC / d).glob("*.cpp"))
    include_dirs = [str(CSRC)]

    if backend == "cpu":
        print("mla_decode: building the CPU operators only "
              f"(torch {torch.__version__}: cuda={torch.version.cuda}, hip={torch.version.hip}, "
              f"CUDA_HOME={cpp_extension.CUDA_HOME})")
        ext = cpp_extension.CppExtension("mla_decode._C", sources, include_dirs=include_dirs,
                                         extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags)
        return ext, backend

    # The GPU dispatcher, the launcher and combine (kernels/common), and each
    # vendor's kernels: sm80 + sm90 (+ bench: the streaming floor) for CUDA, cdna for ROCm (hipified).
    kernel_dirs = ("common", "sm80", "sm90", "bench") if backend == "cuda" else ("common", "cdna")
    gpu_sources = ["csrc/api/dispatch_cuda.cpp"]
    gpu_sources += sorted(rel(p) for d in kernel_dirs for p in (CSRC / "kernels" / d).glob("*.cu"))
    if backend == "cuda":
        archs = check_cuda_archs()
        print(f"mla_decode: building CPU + CUDA operators for TORCH_CUDA_ARCH_LIST={archs}")
        nvcc_flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DMLA_DECODE_WITH_CUDA",
                      "-Xptxas=-warn-spills", "--use_fast_math"]
        if debug:
            nvcc_flags = ["-O0", "-g", "-lineinfo", "-std=c++17", "--expt-relaxed-constexpr", "-DMLA_DECODE_WITH_CUDA"]
        if "9.0a" in re.split(r"[;\s,]+", archs.strip()):
            # The Hopper kernels (wgmma, TMA) run only from sm_90a machine code.
            nvcc_flags.append("-DMLA_DECODE_SM90A")
        if env_flag("MLA_DECODE_TRACE"):
            # Timeline probes (csrc/kernels/common/trace.cuh): a measurement build only.
            nvcc_flags.append("-DMLA_DECODE_TRACE")
        cxx = cxx_flags + ["-DMLA_DECODE_WITH_CUDA"]
    else:
        archs = check_rocm_archs()
        print(f"mla_decode: building CPU + HIP operators for PYTORCH_ROCM_ARCH={archs}")
        nvcc_flags = ["-O3", "-std=c++17", "-DMLA_DECODE_WITH_HIP"]
        cxx = cxx_flags + ["-DMLA_DECODE_WITH_HIP"]
    ext = cpp_extension.CUDAExtension("mla_decode._C", sources + gpu_sources, include_dirs=include_dirs,
                                      extra_compile_args={"cxx": cxx, "nvcc": nvcc_flags}, extra_link_args=link_flags)
    return ext, backend


def local_version_label(backend: str) -> str:
    """PEP 440 local label naming the torch and toolkit the binary is tied to."""
    torch_base = torch.__version__.split("+")[0]
    if backend == "cuda":
        toolkit = "cu" + torch.version.cuda.replace(".", "")
    elif backend == "hip":
        toolkit = "rocm" + torch.version.hip.split("-")[0].replace(".", "")[:3]
    else:
        toolkit = "cpu"
    return f"torch{torch_base}.{toolkit}"


# The sources a wheel carries as package data (mla_decode/_sources/csrc/...).
SOURCE_SUFFIXES = (".h", ".cuh", ".cpp", ".cu")


def object_folder(backend: str, debug: bool) -> str:
    """build/obj-<tag>: one folder per backend, torch install, Python and build flags, so two
    toolchains never overwrite each other's objects and one toolchain always finds its own."""
    key = "|".join([backend, torch.__version__, os.path.dirname(torch.__file__), sys.version,
                    os.environ.get("TORCH_CUDA_ARCH_LIST", "") if backend == "cuda" else "",
                    os.environ.get("PYTORCH_ROCM_ARCH", "") if backend == "hip" else "",
                    str(env_flag("MLA_DECODE_TRACE") is True)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    tag = f"{backend}-torch{torch.__version__.split('+')[0]}-{sys.implementation.cache_tag}"
    return str(ROOT / "build" / f"obj-{tag}{'-debug' if debug else ''}-{digest}")


class BuildExt(cpp_extension.BuildExtension):
    """torch's ninja build, with its objects in the persistent object folder (pip's editable
    and wheel builds would otherwise compile into a new temporary folder every time)."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = OBJECT_DIR


class BuildPy(build_py):
    """Also copies csrc/ into the built package as mla_decode/_sources/csrc/ (not in editable
    mode: there the package reads csrc/ from the checkout it lives in)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dst_root = Path(self.build_lib) / "mla_decode" / "_sources"
        if dst_root.exists():
            shutil.rmtree(dst_root)
        n = 0
        for src in sorted(CSRC.rglob("*")):
            if src.is_file() and src.suffix in SOURCE_SUFFIXES:
                dst = dst_root / src.relative_to(ROOT)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                n += 1
        if n == 0:
            fail(f"no C++/CUDA sources under {CSRC}: the wheel would have nothing to build a submission from")


BASE_VERSION = {}
exec((ROOT / "mla_decode" / "_version.py").read_text(), BASE_VERSION)
ext, backend = build_extension()
OBJECT_DIR = object_folder(backend, env_flag("MLA_DECODE_DEBUG") is True)
VERSION = f"{BASE_VERSION['BASE_VERSION']}+{local_version_label(backend)}"
build_info = ROOT / "mla_decode" / "_build_info.py"
build_info.write_text(
    "# Written by setup.py at build time; do not edit.\n"
    f"VERSION = {VERSION!r}\n"
    f"BACKEND = {backend!r}\n"
    f"TORCH_VERSION = {torch.__version__!r}\n"
    f"CUDA_VERSION = {torch.version.cuda!r}\n"
    f"HIP_VERSION = {torch.version.hip!r}\n"
    f"CUDA_ARCHS = {os.environ.get('TORCH_CUDA_ARCH_LIST') if backend == 'cuda' else None!r}\n"
    f"ROCM_ARCHS = {os.environ.get('PYTORCH_ROCM_ARCH') if backend == 'hip' else None!r}\n"
)

# The native library is tied to the torch release it was compiled against (its C++ ABI):
# pin that release, so pip keeps or installs a torch the wheel can load. numpy: the package
# does not use it, but torch warns on import without it.
TORCH_PIN = f"torch=={torch.__version__.split('+')[0]}"

setup(
    version=VERSION,
    install_requires=[TORCH_PIN, "numpy"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt.with_options(use_ninja=True), "build_py": BuildPy},
)
