// TMA tensor maps over the cache rows, shared by the Hopper kernels whose
// tiles land by TMA: bf16 on the narrow and wide kernels, the fp8 codes of the
// register-V kernel; and over the query, for the wide kernel's bf16 TMA form.
// A map is a kernel parameter (__grid_constant__), encoded on the host for
// each call (tensor_map.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/params.h"

// Tensor maps exist from CUDA 12.0; older toolkits compile these kernels with
// an opaque stand-in for the kernel parameter, driver_encodes_tensor_maps() is
// false there, and the plan never selects the TMA forms (plan.cpp,
// why_not_tma_rows).
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12000
#define MLA_SM90_HAS_TMA 1
#else
#define MLA_SM90_HAS_TMA 0
#endif

namespace mla_decode {
namespace cuda {
namespace sm90 {

#if MLA_SM90_HAS_TMA
using CodeTensorMap = CUtensorMap;
#else
struct alignas(64) CodeTensorMap {
  unsigned long long opaque[16];
};
#endif

// The map over the cache rows: a 2-D tensor of {576 elements, num_cache_rows
// rows} with the cache's row stride, uint8 codes (OCP fp8) or 16-bit values
// (bf16); boxes of 128 bytes x 64 rows (one column block of a 64-key tile),
// 128-byte swizzle (the wgmma operand layout); reads outside the tensor fill
// zeros. cudaErrorNotSupported where the driver has no encoder.
cudaError_t encode_code_map(const MlaDecodeParams& p, CodeTensorMap* map);

// The map over the query: a 3-D tensor of {576 elements, H heads, total_q
// tokens} with the query's head and token strides, bf16; boxes of 64 elements
// x 64 heads x 1 token (one column block of a head group's Q), 128-byte
// swizzle; heads past H fill zeros. The plan runs the forms that use it only
// where the strides allow it (plan.cpp, why_not_tma_query).
cudaError_t encode_q_map(const MlaDecodeParams& p, CodeTensorMap* map);

}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode
