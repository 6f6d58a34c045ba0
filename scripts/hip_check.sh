#!/usr/bin/env bash
# Compile check of the AMD (HIP/ROCm) kernels on a machine without an AMD GPU
# and without a ROCm torch, for CI (.ci/run calls it when it is executable).
#
#   1. Toolchain: Debian's clang-22 (HIP device compiler; it knows gfx950;
#      clang-19, which does not, is used when 22 is absent and cannot be
#      installed), the HIP headers of libamdhip64-dev (HIP 5.2) and the device
#      bitcode of rocm-device-libs; installed with apt-get when missing (root or
#      sudo needed; set MLA_HIP_CHECK_NO_INSTALL=1 to fail instead).
#   2. hipify: csrc/ is copied to a temporary directory and hipified with
#      PyTorch's own hipify (torch.utils.hipify.hipify_python) exactly as
#      torch's CUDAExtension does for a ROCm build (kernels/common/*.cu and
#      kernels/cdna/*.cu -> *.hip, cudaError_t -> hipError_t, <<<>>> ->
#      hipLaunchKernelGGL, ...). The kernel TUs do need it: launch.h and the .cu
#      files use cuda* runtime names, as on every CUDA source tree torch hipifies.
#   3. Every kernel TU (the hipified *.hip) is compiled, device side, to assembly:
#        clang++-22 -x hip --offload-arch=ARCH --cuda-device-only -S -O3 -std=c++17 \
#          -nogpulib --rocm-path=/usr <device bitcode> -D__HIP_PLATFORM_AMD__=1 \
#          -DUSE_ROCM=1 <torch's other hipcc -D flags> -DMLA_DECODE_WITH_HIP -I<hipified csrc>
#      for gfx942 (MI300; required), gfx950 (MI355X; needs LLVM >= 20: with
#      clang-19 it is reported and skipped) and gfx90a (MI200). The host side of each TU is
#      syntax-checked as well.
#      HIP 5.2's headers implement threadIdx and __syncthreads with
#      device-library calls (ROCm >= 6 uses clang builtins), so hip.bc, ockl.bc
#      and the oclc control libraries are linked in (oclc_isa_version_940 for
#      gfx942/gfx950: Debian's 5.2 libraries predate them; nothing used depends
#      on it), as hipcc would link them; the assembly then has no calls.
#   4. scripts/hip_asm_report.py prints a per-kernel table (VGPR, AGPR, SGPR,
#      scratch, LDS, waves/SIMD, the matrix instructions) and the instruction
#      mix of each decode kernel's KV stage loop, then the MI355X time model
#      of docs/amd.md (from the gfx950 assembly), and FAILS unless each
#      decode kernel contains exactly the matrix instructions intended for its
#      arch and format (gfx950: v_mfma_scale_f32_16x16x128_f8f6f4 with E2M1 /
#      E4M3 A operands for MXFP4 / OCP fp8 QK, v_mfma_f32_16x16x32_bf16, and
#      the scaled bf16 converts; gfx942: 16x16x16 bf16 and 16x16x32 fp8;
#      gfx90a: 16x16x16 bf16), every kernel's scratch is within
#      HIP_CHECK_SCRATCH_BUDGET bytes (default 0: no private segment at all),
#      no kernel calls a function or uses a dynamic stack, and LDS <= 64 KB.
#   5. The hipified kernels are also compiled for the host against
#      scripts/hip_emu/hip/hip_runtime.h (a small HIP emulation: fibers for
#      lanes, waves run in random subsets, every instruction builtin computed
#      from AMD's documented semantics) and run on 36 decode problems against
#      a float64 reference (per-element bound, relative Frobenius error
#      < 8e-3 and LSE error < 2e-3, the tests' contract; printed per problem),
#      once as gfx942 (its body, fnuz fp8 in hardware) and once as gfx950 (its
#      body, OCP fp8 and the CDNA4 instructions), after checks of the
#      emulated instructions against scalar references and exhaustive checks
#      of the kernels' register helpers. This checks the kernel logic, not
#      the hardware. HIP_CHECK_EMU=0 skips it.
#
# Environment: HIP_CHECK_OUT=DIR keeps the .s files (DIR/ARCH/*.s);
# HIP_CHECK_ARCHS (default "gfx942 gfx950 gfx90a"); HIP_CLANG (default
# clang++-22, else clang++-19); HIP_CHECK_SCRATCH_BUDGET (default 0).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
if [ -n "${HIP_CLANG:-}" ]; then
  CLANG=$HIP_CLANG
elif command -v clang++-22 >/dev/null 2>&1 || ! command -v clang++-19 >/dev/null 2>&1; then
  CLANG=clang++-22
else
  CLANG=clang++-19
fi
ARCHS=${HIP_CHECK_ARCHS:-"gfx942 gfx950 gfx90a"}
BUDGET=${HIP_CHECK_SCRATCH_BUDGET:-0}
JOBS=$(nproc 2>/dev/null || echo 2)

say() { echo "hip_check: $*"; }
die() { echo "hip_check: FAIL $*" >&2; exit 1; }

# ---- 1. toolchain -------------------------------------------------------------
find_bitcode() {
  local d
  for d in /usr/lib/*/amdgcn/bitcode /usr/lib/amdgcn/bitcode /usr/amdgcn/bitcode; do
    if [ -f "$d/ockl.bc" ]; then echo "$d"; return 0; fi
  done
  return 1
}
have_toolchain() {
  command -v "$CLANG" >/dev/null 2>&1 && [ -f /usr/include/hip/hip_runtime.h ] && find_bitcode >/dev/null
}
if ! have_toolchain; then
  [ "${MLA_HIP_CHECK_NO_INSTALL:-0}" = 1 ] && die "toolchain missing ($CLANG, /usr/include/hip, rocm-device-libs) and MLA_HIP_CHECK_NO_INSTALL=1"
  command -v apt-get >/dev/null 2>&1 || die "toolchain missing and no apt-get: install clang-22 (or clang-19), libamdhip64-dev and rocm-device-libs (Debian 12 names)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "toolchain missing: run as root or install clang-22 (or clang-19) libamdhip64-dev rocm-device-libs"
    SUDO="sudo"
  fi
  pkg=${CLANG#clang++-}
  say "installing clang-$pkg, libamdhip64-dev, rocm-device-libs (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  if ! $SUDO apt-get install -y -qq --no-install-recommends "clang-$pkg" libamdhip64-dev rocm-device-libs >/dev/null \
      && [ -z "${HIP_CLANG:-}" ] && [ "$pkg" = 22 ]; then
    say "clang-22 is not installable here: falling back to clang-19 (gfx950 will not be compiled)"
    CLANG=clang++-19
    $SUDO apt-get install -y -qq --no-install-recommends clang-19 libamdhip64-dev rocm-device-libs >/dev/null
  fi
  have_toolchain || die "toolchain still incomplete after apt-get install"
fi
BITCODE=$(find_bitcode)
HIP_VER=$(sed -n 's/^#define HIP_VERSION_MAJOR \([0-9]*\).*/\1/p; s/^#define HIP_VERSION_MINOR \([0-9]*\).*/\1/p' \
          /usr/include/hip/hip_version.h | paste -sd. -)
say "$("$CLANG" --version | head -1); HIP headers $HIP_VER (/usr/include/hip); device bitcode $BITCODE"

if ! "$PY" -c "import torch.utils.hipify.hipify_python" >/dev/null 2>&1; then
  [ "${MLA_HIP_CHECK_NO_INSTALL:-0}" = 1 ] && die "torch (for its hipify) is not installed"
  # Same policy as scripts/setup_env.sh: torch only when absent.
  say "torch is not installed (its hipify is needed): installing ${MLA_DECODE_TORCH:-torch==2.13.0}"
  "$PY" -m pip install -q "${MLA_DECODE_TORCH:-torch==2.13.0}"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- 2. hipify, as torch.utils.cpp_extension.CUDAExtension does on ROCm --------
cp -r csrc "$tmp/csrc"
(cd "$tmp" && "$PY" - <<'EOF'
import glob, os, sys
from torch.utils.hipify import hipify_python
root = os.getcwd()
# setup.py's source list for a GPU build
srcs = [s for d in ("api", "plan", "cpu") for s in sorted(glob.glob(f"csrc/{d}/*.cpp"))]
srcs += [s for d in ("common", "cdna") for s in sorted(glob.glob(f"csrc/kernels/{d}/*.cu"))]
res = hipify_python.hipify(project_directory=root, output_directory=root,
                           header_include_dirs=[os.path.join(root, "csrc")], includes=[os.path.join(root, "*")],
                           extra_files=[os.path.abspath(s) for s in srcs], show_detailed=False,
                           is_pytorch_extension=True, hipify_extra_files_only=True)
# What CUDAExtension then compiles: the hipified path of each source, else the source.
built = []
for s in srcs:
    r = res.get(os.path.abspath(s))
    built.append(os.path.relpath(r.hipified_path, root) if r is not None and r.hipified_path else s)
open("host_sources.txt", "w").write("\n".join(b for b in built if b.endswith(".cpp")) + "\n")
open("kernel_tus.txt", "w").write("\n".join(b for b in built if b.endswith(".hip")) + "\n")
print("hip_check: hipified sources a ROCm build compiles: " + ", ".join(built))
EOF
) > "$tmp/hipify.log" 2>&1 || { cat "$tmp/hipify.log"; die "hipify failed"; }
grep "^hip_check:" "$tmp/hipify.log"
TUS=$(cat "$tmp/kernel_tus.txt")
[ -n "$TUS" ] || die "hipify produced no kernel TU (*.hip)"
# Every TU by name: its path with '/' as '__' (csrc__kernels__cdna__mfma_bf16).
tu_name() { echo "${1%.hip}" | sed 's@/@__@g'; }
mkdir -p "$tmp/src"
for tu in $TUS; do ln -s "$tmp/$tu" "$tmp/src/$(tu_name "$tu").hip"; done

# ---- 3. device compile per arch --------------------------------------------------
# torch's hipcc flags (COMMON_HIP_FLAGS + COMMON_HIPCC_FLAGS) and setup.py's.
DEFS=(-D__HIP_PLATFORM_AMD__=1 -DUSE_ROCM=1 -DCUDA_HAS_FP16=1 -D__HIP_NO_HALF_OPERATORS__=1
      -D__HIP_NO_HALF_CONVERSIONS__=1 -DHIP_ENABLE_WARP_SYNC_BUILTINS=1 -DMLA_DECODE_WITH_HIP)
# clang >= 20 no longer predefines __AMDGCN_WAVEFRONT_SIZE, which HIP 5.2's
# headers use for warpSize; every target checked here (gfx90a/gfx942/gfx950)
# runs wave64. (Lets HIP_CLANG=clang++-22 compile gfx950.)
CLANG_MAJOR=$("$CLANG" --version | sed -nE '1s/.*version ([0-9]+).*/\1/p')
if [ "${CLANG_MAJOR:-0}" -ge 20 ]; then DEFS+=(-D__AMDGCN_WAVEFRONT_SIZE=64); fi
# Runs "$@" for every word of $ITEMS in parallel ({} = the item), at most
# $JOBS at a time; fails if any run fails (its log is printed).
parallel_each() {
  local item pids=() logs=() i rc=0
  for item in $ITEMS; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.05; done
    local log="$tmp/job.$(( ${#pids[@]} )).log"
    ( set +e; "${@//\{\}/$item}" > "$log" 2>&1 ) &
    pids+=($!); logs+=("$log")
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then cat "${logs[$i]}"; rc=1; elif [ -s "${logs[$i]}" ]; then cat "${logs[$i]}"; fi
  done
  return $rc
}
bitcode_flags() {  # $1 = arch
  local isa=${1#gfx} f out=""
  [ -f "$BITCODE/oclc_isa_version_$isa.bc" ] || isa=940
  for f in hip ockl oclc_abi_version_500 oclc_wavefrontsize64_on oclc_daz_opt_off oclc_finite_only_off \
           oclc_unsafe_math_off oclc_correctly_rounded_sqrt_on "oclc_isa_version_$isa"; do
    out="$out -Xclang -mlink-builtin-bitcode -Xclang $BITCODE/$f.bc"
  done
  echo "$out"
}
arch_known() {  # does this clang know the arch?
  echo '__global__ void k() {}' > "$tmp/probe.hip"
  "$CLANG" -x hip --offload-arch="$1" --cuda-device-only -S -nogpulib --rocm-path=/usr "$tmp/probe.hip" \
    -o /dev/null > "$tmp/probe.log" 2>&1
}
reports=()
compiled=()
for arch in $ARCHS; do
  if ! arch_known "$arch"; then
    if [ "$arch" = gfx942 ]; then cat "$tmp/probe.log"; die "$CLANG cannot compile for gfx942"; fi
    say "$arch: NOT compiled: $("$CLANG" --version | head -1) does not know $arch ($(head -1 "$tmp/probe.log"))."
    [ "$arch" = gfx950 ] && say "  gfx950 needs LLVM >= 20 (ROCm >= 7.0); gfx950-only code stays behind #if defined(__gfx950__) and is exercised only by the host emulation below."
    continue
  fi
  mkdir -p "$tmp/s/$arch"
  read -r -a BCF <<< "$(bitcode_flags "$arch")"
  ITEMS=$(for tu in $TUS; do tu_name "$tu"; done)
  parallel_each "$CLANG" -x hip --offload-arch="$arch" --cuda-device-only -S -O3 -std=c++17 -nogpulib \
      --rocm-path=/usr "${BCF[@]}" "${DEFS[@]}" -I"$tmp/csrc" "$tmp/src/{}.hip" -o "$tmp/s/$arch/{}.s" \
    || die "device compile for $arch (messages above)"
  for tu in $TUS; do reports+=("$arch:$tmp/s/$arch/$(tu_name "$tu").s"); done
  compiled+=("$arch")
  say "$arch: compiled $(echo $TUS | wc -w) TUs"
done
# Host side of each TU (the launch code hipify wrote), once.
for tu in $TUS; do
  "$CLANG" -x hip --offload-arch=gfx942 --cuda-host-only -fsyntax-only -O3 -std=c++17 -nogpulib \
    --rocm-path=/usr "${DEFS[@]}" -I"$tmp/csrc" "$tmp/$tu" || die "host-side compile of $tu"
done
say "host side of $(echo $TUS | wc -w) TUs: ok"
# The hipified .cpp sources, as a ROCm build compiles them: the host C++
# compiler with torch's COMMON_HIP_FLAGS (-D__HIP_PLATFORM_AMD__=1 -DUSE_ROCM=1)
# and setup.py's flags, against this (CPU) torch's headers. dispatch_hip.cpp
# includes ATen/hip headers that only a ROCm torch has: not compiled here.
CXX_HOST=${CXX:-c++}
TORCH_INC=$("$PY" -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")
PY_INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
ITEMS=$(grep -v 'dispatch_hip' "$tmp/host_sources.txt" | tr '\n' ' ')
# shellcheck disable=SC2086
parallel_each "$CXX_HOST" -std=c++17 -fsyntax-only -w -D__HIP_PLATFORM_AMD__=1 -DUSE_ROCM=1 -DMLA_DECODE_BUILD \
    -DMLA_DECODE_WITH_HIP $TORCH_INC -I"$PY_INC" -I"$tmp/csrc" "$tmp/{}" \
  || die "host compile of the hipified .cpp sources (as a ROCm build does)"
say "hipified .cpp sources with the host compiler and ROCm defines: ok ($(echo $ITEMS | wc -w) files; dispatch_hip.cpp needs a ROCm torch)"
if [ -n "${HIP_CHECK_OUT:-}" ]; then
  mkdir -p "$HIP_CHECK_OUT"
  for arch in "${compiled[@]}"; do mkdir -p "$HIP_CHECK_OUT/$arch" && cp "$tmp/s/$arch/"*.s "$HIP_CHECK_OUT/$arch/"; done
  say "assembly written to $HIP_CHECK_OUT/<arch>/"
fi

# ---- 4. resource table and checks ------------------------------------------------------
say "per-kernel resources (device assembly metadata):"
"$PY" scripts/hip_asm_report.py --predict --scratch-budget "$BUDGET" "${reports[@]}" || die "resource checks (see above)"

# ---- 5. host emulation of the hipified kernels ------------------------------------------
if [ "${HIP_CHECK_EMU:-1}" != 0 ]; then
  for arch in gfx942 gfx950; do
    mkdir -p "$tmp/emu/$arch"
    cp "$ROOT/scripts/hip_emu/emu_main.cpp" "$tmp/src/emu_main.hip"
    cp "$tmp/csrc/plan/plan.cpp" "$tmp/src/plan.hip"  # the plan the dispatcher runs
    ITEMS=$(for tu in $TUS; do tu_name "$tu"; done; echo emu_main; echo plan)
    parallel_each "$CLANG" -x c++ -std=c++17 -O1 -U_FORTIFY_SOURCE -Wno-psabi -D__HIPCC__ -D__HIP_PLATFORM_AMD__=1 -DUSE_ROCM=1 \
        -D__${arch}__ -I"$ROOT/scripts/hip_emu" -I"$tmp/csrc" -c "$tmp/src/{}.hip" -o "$tmp/emu/$arch/{}.o" \
      || die "host-emulation build ($arch)"
    "$CLANG" "$tmp/emu/$arch/"*.o -o "$tmp/emu/$arch/run"
    say "host emulation as $arch:"
    "$tmp/emu/$arch/run" | sed 's/^/  /'
    [ "${PIPESTATUS[0]}" = 0 ] || die "host emulation ($arch): outputs differ from the float64 reference"
  done
fi
say "ok (compiled for: ${compiled[*]}; scratch budget $BUDGET B)"
