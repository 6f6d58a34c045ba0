// Launchers of the Hopper (sm_90a) narrow kernels (H < 64; the plan decides
// when they run): the narrow kernel (bf16 tiles landed by TMA, OCP fp8 and
// MXFP4 decoded by producer warpgroups) and its register-V form for OCP fp8,
// and the TMA tensor-map encoding both TMA forms use. NVIDIA only: on a ROCm
// build this translation unit is empty.
#include "common/portability.h"
#if !MLA_PLATFORM_HIP


#include "kernels/sm90/narrow_register_v_kernel.cuh"  // includes the narrow kernel
#include "plan/kernel_geometry.h"
#if MLA_NARROW_HAS_TMA
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

namespace mla_decode {
namespace cuda {

namespace {

static_assert(sm90::narrow::Smem::kTotal == plan::kNarrowSmemBytes, "plan/kernel_geometry.h: the narrow layout");
static_assert(sm90::narrow_fp8::Smem::kTotal == plan::kNarrowRegisterVSmemBytes,
              "plan/kernel_geometry.h: the register-V layout");
static_assert(sm90::narrow::kTileTokens == kHopperTileTokens, "the plan splits by 64-key tiles");

#if MLA_NARROW_HAS_TMA
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
#endif

// The TMA map over the cache rows: a 2-D tensor of {576 elements,
// num_cache_rows rows} with the cache's row stride, uint8 codes (the fp8
// register-V kernel) or 16-bit values (bf16 on the narrow kernel); boxes of
// 128 bytes x 64 rows (one column block of a stage), 128-byte swizzle (the
// wgmma operand layout); reads outside the tensor fill zeros.
cudaError_t encode_code_map(const MlaDecodeParams& p, sm90::CodeTensorMap* map) {
#if MLA_NARROW_HAS_TMA
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const bool bf16 = p.format == KvFormat::kBf16;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kHeadDimQK), static_cast<cuuint64_t>(p.num_cache_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.kv_row_stride_bytes)};
  const cuuint32_t box[2] = {bf16 ? 64u : 128u, static_cast<cuuint32_t>(sm90::narrow::kTileTokens)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
                            const_cast<void*>(p.kv), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
#else
  (void)p;
  (void)map;
  return cudaErrorNotSupported;
#endif
}

// The narrow kernel proper (fp8 with the f16 QK and MXFP4: producers' decode;
// bf16: TMA-landed tiles, `map` over the cache; the others ignore it).
template <KvFormat F>
cudaError_t launch_narrow_f16(const DecodeLaunch& args, const sm90::CodeTensorMap& map, cudaStream_t stream) {
  constexpr int kSmem = sm90::narrow::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(sm90::narrow::decode_narrow_kernel<F>, split_grid(args), sm90::narrow::kThreads,
                                  kSmem, configured_devices, stream, args, map);
}

template <KvFormat F>
cudaError_t launch_narrow_format(const DecodeLaunch& args, cudaStream_t stream) {
  sm90::CodeTensorMap map{};
  if (F == KvFormat::kBf16) {
    const cudaError_t err = encode_code_map(args.p, &map);
    if (err != cudaSuccess) return err;
  }
  return launch_narrow_f16<F>(args, map, stream);
}

}  // namespace

bool driver_encodes_tensor_maps() {
#if MLA_NARROW_HAS_TMA
  return tensor_map_encoder() != nullptr;
#else
  return false;  // a toolkit without tensor maps
#endif
}

cudaError_t launch_narrow(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kFp8E4M3FN: return launch_narrow_format<KvFormat::kFp8E4M3FN>(args, stream);
    case KvFormat::kMxfp4: return launch_narrow_format<KvFormat::kMxfp4>(args, stream);
    case KvFormat::kBf16: return launch_narrow_format<KvFormat::kBf16>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

cudaError_t launch_narrow_register_v(const DecodeLaunch& args, cudaStream_t stream) {
  if (args.p.format != KvFormat::kFp8E4M3FN) return cudaErrorInvalidValue;  // a planning bug
  sm90::CodeTensorMap map{};
  const cudaError_t err = encode_code_map(args.p, &map);
  if (err != cudaSuccess) return err;
  constexpr int kSmem = sm90::narrow_fp8::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(sm90::narrow_fp8::decode_narrow_fp8_kernel, split_grid(args),
                                  sm90::narrow_fp8::kThreads, kSmem, configured_devices, stream, args, map);
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP
