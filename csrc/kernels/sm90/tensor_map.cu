// Host side of the TMA tensor maps (tensor_map.h): the driver's encoder,
// looked up once, and the maps over a call's cache rows and query. NVIDIA
// only: on a ROCm build this translation unit is empty.
#include "common/portability.h"
#if !MLA_PLATFORM_HIP

#include "kernels/common/launch.h"
#include "kernels/sm90/tensor_map.h"
#if MLA_SM90_HAS_TMA
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

namespace mla_decode {
namespace cuda {
namespace sm90 {

namespace {
#if MLA_SM90_HAS_TMA
// The driver's tensor-map encoder, looked up once through the runtime (no
// link against libcuda); null where the driver does not provide it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
#if CUDART_VERSION >= 12050
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &status);
#endif
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
      // A failed lookup is recorded as the runtime's last error: clear it, or
      // the next launch check (cudaGetLastError) would report it.
      if (err != cudaSuccess) (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A tiled map of `rank` dimensions (innermost first; strides in bytes for
// dimensions 1..), boxes of `box`, 128-byte swizzle (the wgmma operand
// layout), zeros outside the tensor.
cudaError_t encode_tiled(CodeTensorMap* map, CUtensorMapDataType type, cuuint32_t rank, const void* base,
                         const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, type, rank, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
#endif

}  // namespace

// (tensor_map.h states the map's shape.)
cudaError_t encode_code_map(const MlaDecodeParams& p, CodeTensorMap* map) {
#if MLA_SM90_HAS_TMA
  const bool bf16 = p.format == KvFormat::kBf16;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kHeadDimQK), static_cast<cuuint64_t>(p.num_cache_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.kv_row_stride_bytes)};
  const cuuint32_t box[2] = {bf16 ? 64u : 128u, 64u};
  return encode_tiled(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p.kv, dims,
                      strides, box);
#else
  (void)p;
  (void)map;
  return cudaErrorNotSupported;
#endif
}

// (tensor_map.h states the map's shape.)
cudaError_t encode_q_map(const MlaDecodeParams& p, CodeTensorMap* map) {
#if MLA_SM90_HAS_TMA
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kHeadDimQK), static_cast<cuuint64_t>(p.num_heads),
                              static_cast<cuuint64_t>(p.total_q)};
  // A dimension of size 1 has its stride recorded as 0 (validation.cpp); it
  // is never stepped along, so any valid stride describes it.
  const cuuint64_t head_bytes = p.num_heads > 1 ? static_cast<cuuint64_t>(p.q_stride_head) * 2 : kHeadDimQK * 2;
  const cuuint64_t token_bytes =
      p.total_q > 1 ? static_cast<cuuint64_t>(p.q_stride_token) * 2 : head_bytes * static_cast<cuuint64_t>(p.num_heads);
  const cuuint64_t strides[2] = {head_bytes, token_bytes};
  const cuuint32_t box[3] = {64u, 64u, 1u};
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, p.q, dims, strides, box);
#else
  (void)p;
  (void)map;
  return cudaErrorNotSupported;
#endif
}

}  // namespace sm90

bool driver_encodes_tensor_maps() {
#if MLA_SM90_HAS_TMA
  return sm90::tensor_map_encoder() != nullptr;
#else
  return false;  // a toolkit without tensor maps
#endif
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP
