// The decode plan: which kernel runs a call, and with which knobs.
//
// make_plan() is a pure function of the call's shapes (MlaDecodeParams: sizes,
// format, layout, pointer alignment; never tensor data, so no device sync),
// the device's facts (gathered once per device by the dispatcher) and the
// overrides (the user's num_splits; tests and A/B runs may force a kernel or
// cap the shared memory). It is plain C++: the CPU build compiles it too, so
// the plan is unit-tested on machines without a GPU (mla_decode.explain with
// DeviceFacts of an H200, tests/test_plan.py).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/params.h"

namespace mla_decode {
namespace plan {

// One value per split kernel that exists (README, "Layout", maps each to its
// file).
enum class Kernel : uint8_t {
  kMmaSync = 0,          // NVIDIA sm_80+: 16 heads per CTA on mma.sync (kernels/sm80)
  kWide = 1,             // Hopper, H >= 64: 64 heads per CTA on wgmma (kernels/sm90/wide_kernel.cuh)
  kNarrow = 2,           // Hopper, H < 64: keys as the M of wgmma, producer decode (kernels/sm90/narrow_kernel.cuh)
  kNarrowRegisterV = 3,  // Hopper, H < 64, OCP fp8: e4m3 QK on TMA-landed codes, V converted in
                         // registers (kernels/sm90/narrow_register_v_kernel.cuh)
  kMfma = 4,             // AMD CDNA: 16 heads per workgroup on MFMA (kernels/cdna)
};
constexpr int kNumKernels = 5;

// "mma_sync", "wide", "narrow", "narrow_register_v", "mfma".
const char* kernel_name(Kernel k);
// The kernel named `name` (kernel_name's spelling); false if there is none.
bool kernel_from_name(const char* name, Kernel* k);

enum class Vendor : uint8_t { kNvidia = 0, kAmd = 1 };

// What the plan needs to know about the device. The dispatcher fills it once
// per device (properties cached by PyTorch, two driver queries), so a call
// costs no driver round trip.
struct DeviceFacts {
  Vendor vendor = Vendor::kNvidia;
  int arch = 0;                  // NVIDIA: 10 * major + minor (90: H100 / H200); AMD: the gfx number (942)
  bool sm90a_kernels = false;    // the build has sm_90a code and the device runs it (arch 90)
  bool tensor_maps = false;      // the driver encodes TMA tensor maps (cuTensorMapEncodeTiled)
  int num_sms = 1;
  int smem_per_block_optin = 0;  // bytes a block may opt in to (227 KB on sm_90, 99 KB on sm_86/89/120)
  int smem_per_sm = 0;
  int64_t l2_bytes = 0;          // 0: unknown (no L2 stream hint)
};

struct Overrides {
  int num_splits = 0;          // the operator's num_splits: 0 = automatic
  bool force_kernel = false;   // run `kernel`; the plan reports why it cannot if it does not apply
  Kernel kernel = Kernel::kMmaSync;
  int smem_limit = 0;          // > 0: plan as if a block could opt in to at most this many bytes
};

struct Plan {
  Kernel kernel = Kernel::kMmaSync;
  int32_t head_groups = 1;     // ceil(H / heads per CTA)
  int32_t num_splits = 1;      // KV splits per (query token, head group)
  int32_t stages = 0;          // mma.sync: its cp.async ring depth (kernels/sm80/mma_sync_layout.h); else 0
  int32_t smem_bytes = 0;      // dynamic shared memory of the split kernel
  int32_t smem_limit = 0;      // what the device (or Overrides::smem_limit) allows per block
  bool stream_kv = false;      // TMA tile loads with L2 evict_first (small cache, one head group)
  bool tma_tiles = false;      // the tiles land by TMA: bf16 on the narrow kernel and (indptr layout) on the
                               // wide kernel, the register-V kernel's codes
  bool programmatic_combine = false;  // the combine launches as a programmatic dependent (sm_90+)
  const char* why = "";        // the rule that chose the kernel
  const char* error = nullptr;  // non-null: this call cannot run as planned (a forced kernel that
                                // does not apply); a sentence for the error message
};

// The plan of one call. Deterministic; allocates nothing.
Plan make_plan(const MlaDecodeParams& p, const DeviceFacts& device, const Overrides& overrides);

// nullptr when `kernel` can run `p` on `device`, else the reason it cannot.
const char* why_not(Kernel kernel, const MlaDecodeParams& p, const DeviceFacts& device);

// Bytes of fp32 workspace the plan needs (0 with one split): partial outputs
// (splits, total_q * H, 512) followed by partial LSE (splits, total_q * H).
size_t workspace_bytes(const MlaDecodeParams& p, const Plan& plan);

}  // namespace plan
}  // namespace mla_decode
