#!/usr/bin/env bash
# Compiles every CUDA translation unit with nvcc alone (no GPU and no CUDA
# torch needed: the kernel sources include no ATen) for each arch of setup.py's
# default TORCH_CUDA_ARCH_LIST (sm_80 and sm_90a, with the Hopper kernel
# enabled), so broken device code cannot land. Prints each TU's register /
# spill report. ARCH="..." compiles for that gencode list only.
#
# The sm_90a pass compiles to cubins (the sm_80 pass covers the host code) and
# checks each kernel's machine-code size against a budget (KERNEL_CODE_KB,
# default 96): a call after other kernels fetches its code from L2 or DRAM, so
# code size is paid per call (docs/kernels.md, section 10, "Code size").
# Then the sm_90a trace build (-DMLA_DECODE_TRACE, kernels/common/trace.cuh).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
  echo "check_cuda_compile: nvcc not found (set NVCC=/path/to/nvcc); CUDA compile check NOT run"
  exit "${MLA_DECODE_REQUIRE_NVCC:-0}"
fi
if [ -n "${ARCH:-}" ]; then
  ARCHS=("$ARCH")
else
  ARCHS=("-gencode=arch=compute_80,code=sm_80" "-gencode=arch=compute_90a,code=sm_90a -DMLA_DECODE_SM90A")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
budget_kb=${KERNEL_CODE_KB:-96}
sizes=$tmp/sizes
: > "$sizes"
for arch in "${ARCHS[@]}"; do
  label=$(echo "$arch" | sed -E 's/.*code=(sm_[0-9a]+).*/\1/')
  # cubins (and the size check) for the default sm_90a pass when readelf can read them
  mode=-c
  if [ -z "${ARCH:-}" ] && [ "$label" = sm_90a ] && command -v readelf > /dev/null; then mode=-cubin; fi
  for cu in csrc/kernels/common/*.cu csrc/kernels/sm80/*.cu csrc/kernels/sm90/*.cu csrc/kernels/bench/*.cu; do
    out="$tmp/$(basename "$cu").o"
    # shellcheck disable=SC2086  # $arch is a list of flags
    if "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr --use_fast_math -I csrc $arch -Xptxas=-v,-warn-spills \
        $mode "$cu" -o "$out" > "$tmp/log" 2>&1; then
      if [ "$mode" = -cubin ]; then
        # each kernel's .text section: size (hex) and name
        readelf -S -W "$out" 2> /dev/null | awk '$2 ~ /^\.text\./ {print $6, substr($2, 7)}' >> "$sizes" || true
      fi
      # (a translation unit without kernels, e.g. host code only, reports no registers)
      regs=$(grep -E "Used [0-9]+ registers" "$tmp/log" | sed -E 's/.*Used ([0-9]+) registers.*/\1/' | sort -n | tail -1 || true)
      spills=$(grep -Eo "[0-9]+ bytes spill stores" "$tmp/log" | sort -n | tail -1 || true)
      echo "ok   $label $cu (max registers ${regs:-?}, ${spills:-0 bytes spill stores})"
    else
      echo "FAIL $label $cu"; cat "$tmp/log"; status=1
    fi
  done
done
if [ -s "$sizes" ]; then
  echo "kernel machine code, sm_90a (budget ${budget_kb} KiB per kernel):"
  while read -r hex name; do
    kb=$(( 16#$hex / 1024 ))
    mark="ok  "
    if [ "$kb" -gt "$budget_kb" ]; then mark="OVER"; status=1; fi
    echo "  $mark ${kb} KiB $(echo "$name" | c++filt 2> /dev/null | cut -c1-110 || echo "$name")"
  done < "$sizes"
fi
# The trace build (MLA_DECODE_TRACE=1: the timeline probes of trace.cuh), sm_90a:
# a measurement tool that must still compile when a device call needs it.
if [ -z "${ARCH:-}" ]; then
  for cu in csrc/kernels/common/*.cu csrc/kernels/sm80/*.cu csrc/kernels/sm90/*.cu; do
    if "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr --use_fast_math -I csrc \
        -gencode=arch=compute_90a,code=sm_90a -DMLA_DECODE_SM90A -DMLA_DECODE_TRACE -c "$cu" -o "$tmp/trace.o" \
        > "$tmp/log" 2>&1; then
      echo "ok   sm_90a trace build $cu"
    else
      echo "FAIL sm_90a trace build $cu"; cat "$tmp/log"; status=1
    fi
  done
fi
exit $status
