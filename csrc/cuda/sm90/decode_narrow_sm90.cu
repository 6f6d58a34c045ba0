// The Hopper (sm_90a) narrow kernel's launcher (OCP fp8 and MXFP4 caches with
// H < 64), and the test of whether a call can take it.
// NVIDIA only: on a ROCm build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "decode_kernel_narrow_fp8_sm90.cuh"  // includes the narrow kernel
#if MLA_NARROW_HAS_TMA
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

namespace mla_decode {
namespace cuda {

namespace {

// The narrow kernel's choice for a format: "mma" turns it off, "narrow"
// forces it, anything else leaves it to the plan's size thresholds
// (narrow_kernel_pays_off: MXFP4 from 16k query tokens x keys, OCP fp8 from
// 64k on the register-V kernel, else on long sequences only).
HopperChoice narrow_choice(KvFormat format) {
  return hopper_kernel_choice(
      format, format == KvFormat::kFp8E4M3FN || format == KvFormat::kMxfp4 || format == KvFormat::kBf16,
      KernelSwitch::kNarrow);
}

// The OCP fp8 calls that the narrow kernel runs with the indptr layout take
// its register-V form with the e4m3 QK (decode_kernel_narrow_fp8_sm90.cuh;
// faster at every narrow competition shape, its LSE error ~4e-5 of the
// largest logit: docs/performance.md sessions 14-15) unless
// MLA_DECODE_NARROW_QK=f16 (read once per process) keeps the f16 QK.
bool narrow_e4m3_qk_requested() {
  static const bool requested = [] {
    const char* v = std::getenv("MLA_DECODE_NARROW_QK");
    return v == nullptr || std::strcmp(v, "f16") != 0;
  }();
  return requested;
}

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

cudaError_t launch_narrow_register_v(const DecodeLaunch& args, const sm90::CodeTensorMap& map, cudaStream_t stream) {
  constexpr int kSmem = sm90::narrow_fp8::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(sm90::narrow_fp8::decode_narrow_fp8_kernel, split_grid(args),
                                  sm90::narrow_fp8::kThreads, kSmem, configured_devices, stream, args, map);
}

template <KvFormat F>
cudaError_t launch_narrow_format(const DecodeLaunch& args, cudaStream_t stream) {
  const bool register_v = F == KvFormat::kFp8E4M3FN && narrow_register_v_applies(args.p);
  sm90::CodeTensorMap map{};
  if (F == KvFormat::kBf16 || register_v) {
    const cudaError_t err = encode_code_map(args.p, &map);
    if (err != cudaSuccess) return err;
  }
  if (register_v) return launch_narrow_register_v(args, map, stream);
  return launch_narrow_f16<F>(args, map, stream);
}

#if MLA_NARROW_HAS_TMA
// Whether encode_code_map can describe this call's cache for the TMA forms
// (the fp8 register-V kernel, bf16 on the narrow kernel): contiguous rows (TMA
// reads each tile as boxes of rows kv_indptr[b] + j) addressed by int32
// tensor-map coordinates, at least one cache row (an empty tensor map is
// invalid) and a row stride the encoder accepts (a multiple of 16 bytes,
// checked by the caller, and at least one row of the format's bytes: a
// one-row cache may carry any stride), and a driver with the encoder.
bool tma_rows_addressable(const MlaDecodeParams& p, int64_t row_bytes) {
  return p.layout == KvLayout::kIndptr && p.num_cache_rows > 0 &&
         p.num_cache_rows <= INT_MAX - 2 * sm90::narrow::kTileTokens && p.kv_row_stride_bytes >= row_bytes &&
         p.kv_row_stride_bytes < (int64_t{1} << 40) && tensor_map_encoder() != nullptr;
}
#endif

}  // namespace

// OCP fp8 takes the register-V kernel where its rows can be described to TMA
// (tma_rows_addressable) and MLA_DECODE_NARROW_QK is not "f16"; elsewhere
// (no tensor-map encoder, or a toolkit without tensor maps) such calls keep
// the f16 QK. (Outside the anonymous namespace: the plan's size threshold
// depends on it, decode_launch.cu.)
bool narrow_register_v_applies(const MlaDecodeParams& p) {
#if MLA_NARROW_HAS_TMA
  return p.format == KvFormat::kFp8E4M3FN && narrow_e4m3_qk_requested() && tma_rows_addressable(p, kHeadDimQK);
#else
  (void)p;
  return false;
#endif
}

// bf16 on the narrow kernel: its tiles land by TMA (no producers' decode), so
// it needs rows TMA can address, of 1152 bytes.
bool narrow_bf16_applies(const MlaDecodeParams& p) {
#if MLA_NARROW_HAS_TMA
  return p.format == KvFormat::kBf16 && tma_rows_addressable(p, 2 * kHeadDimQK);
#else
  (void)p;
  return false;
#endif
}

// The larger of the two kernels' layouts, so that a plan that fits fits either.
int narrow_smem_bytes() { return std::max(sm90::narrow::Smem::kTotal, sm90::narrow_fp8::Smem::kTotal); }

int narrow_tile_tokens() { return sm90::narrow::kTileTokens; }

bool narrow_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.num_heads >= kWideRows || narrow_choice(p.format) == HopperChoice::kOff) return false;
  if (p.format == KvFormat::kBf16 && !narrow_bf16_applies(p)) return false;  // TMA: indptr rows only
  return hopper_kernel_fits(p, narrow_smem_bytes(), smem_per_block_optin);
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;
#endif
}

bool narrow_kernel_forced(KvFormat format) { return narrow_choice(format) == HopperChoice::kForced; }

cudaError_t launch_narrow(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kFp8E4M3FN: return launch_narrow_format<KvFormat::kFp8E4M3FN>(args, stream);
    case KvFormat::kMxfp4: return launch_narrow_format<KvFormat::kMxfp4>(args, stream);
    case KvFormat::kBf16: return launch_narrow_format<KvFormat::kBf16>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP
