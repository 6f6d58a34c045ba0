// QK of the narrow kernel's e4m3-QK variant (built in session 14 from this
// probe: decode_kernel_narrow_sm90.cuh, kE4m3Qk, which uses two Q terms and
// promotes every k-step) in isolation, for an H100/H200: a 64-key tile of OCP fp8
// codes landed in shared memory by TMA (cp.async.bulk.tensor.2d, 128-byte
// swizzle, the 576-byte rows' tail past dim 576 zero-filled by the tensor
// bounds) and read directly by e4m3 wgmma as A, with Q split per head into
// three e4m3 terms (hi, mid = residual x 2^4, lo = residual x 2^8) side by
// side along N = 48, so the key tile is read once per k-step.
// scripts/tma_qk_probe.py builds this with nvcc, feeds random codes and Q and
// compares S = K Q^T with a float64 reference on the same codes.
//
// Layouts (all 128-byte swizzled, K-major, 1024-byte atoms of 8 rows):
//   K tile: 5 column blocks of 64 rows x 128 bytes (dims 128 b ..), 8 KB each,
//           exactly as TMA writes a [64 x 128 B] box with SWIZZLE_128B.
//   B (Q terms): 5 column blocks of 48 rows x 128 bytes (6 KB each): row
//           16 t + h = term t of head h.
// Accumulator of m64n48k32: d[4i + 2r + e] = (key 16 w + g + 8r, column
// 8i + 2c + e), columns 0-15 hi, 16-31 mid, 32-47 lo.
#include <cuda.h>
#include <cuda_fp8.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "../csrc/cuda/ptx_sm80.cuh"
#include "../csrc/cuda/sm90/ptx_sm90.cuh"
#include "../csrc/cuda/sm90/tile_loader_sm90.cuh"

using namespace mla_decode::cuda;
using namespace mla_decode::cuda::sm90;

namespace {

constexpr int kKeys = 64, kHeads = 16, kTerms = 3, kDims = 576, kBlocks = 5;
constexpr int kKBlockBytes = kKeys * 128;            // 8192
constexpr int kBBlockBytes = kTerms * kHeads * 128;  // 6144
constexpr int kSmem = kBlocks * kKBlockBytes + kBlocks * kBBlockBytes + 1024;

__device__ __forceinline__ void wgmma_m64n48k32_e4m3(float (&d)[24], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23}, %24, %25, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(desc_a), "l"(desc_b), "n"(1));
#endif
}

__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float from_e4m3(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

__global__ void __launch_bounds__(128) tma_qk_kernel(const __grid_constant__ CUtensorMap kv_map, int row0,
                                                     const uint16_t* __restrict__ q, float* __restrict__ s_out,
                                                     int steps_per_group) {
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw;
  const uint32_t base = smem_u32(smem);
  const uint32_t k_smem = base, b_smem = base + kBlocks * kKBlockBytes;
  const uint32_t bar = b_smem + kBlocks * kBBlockBytes;
  float* q_scale = reinterpret_cast<float*>(smem + kBlocks * kKBlockBytes + kBlocks * kBBlockBytes + 64);
  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(kBlocks * kKBlockBytes)
                 : "memory");
    for (int blk = 0; blk < kBlocks; ++blk) {
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
              "r"(k_smem + blk * kKBlockBytes),
          "l"(reinterpret_cast<uint64_t>(&kv_map)), "r"(128 * blk), "r"(row0), "r"(bar)
          : "memory");
    }
  }
  // Q terms: head h = tid / 8 (8 threads per head), scaled by 2^e with
  // max |q| 2^e in [224, 448), then hi = e4m3(x), mid = e4m3((x - hi) 2^4),
  // lo = e4m3((x - hi - mid 2^-4) 2^8).
  {
    const int h = tid / 8, part = tid % 8;
    float amax = 0.f;
    for (int d = part; d < kDims; d += 8) amax = fmaxf(amax, fabsf(__uint_as_float(uint32_t(q[h * kDims + d]) << 16)));
    for (int o = 1; o < 8; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 0.f) {
      frexpf(amax, &e);          // amax = m 2^e, m in [0.5, 1)
      e = 8 - e;                 // amax 2^e in [128, 256): 2x headroom below 448 after rounding
    }
    const float scale = ldexpf(1.f, e);
    if (part == 0) q_scale[h] = ldexpf(1.f, -e);
    for (int d = part; d < kDims; d += 8) {
      const float x = __uint_as_float(uint32_t(q[h * kDims + d]) << 16) * scale;
      const uint8_t t0 = to_e4m3(x);
      const float r1 = x - from_e4m3(t0);
      const uint8_t t1 = to_e4m3(r1 * 16.f);
      const float r2 = r1 - from_e4m3(t1) * (1.f / 16.f);
      const uint8_t t2 = to_e4m3(r2 * 256.f);
      const uint8_t terms[3] = {t0, t1, t2};
      for (int t = 0; t < kTerms; ++t) {
        const int row = 16 * t + h, blk = d / 128, byte = d % 128;
        smem[kBlocks * kKBlockBytes + blk * kBBlockBytes + swizzled_offset(row, byte / 16, 0) + byte % 16] = terms[t];
      }
    }
    // Dims 576..639 of the last block: zero (the K tile's are zero-filled by TMA).
    for (int i = tid; i < kTerms * kHeads * 64; i += 128) {
      const int row = i / 64, byte = 64 + i % 64;
      smem[kBlocks * kKBlockBytes + 4 * kBBlockBytes + swizzled_offset(row, byte / 16, 0) + byte % 16] = 0;
    }
  }
  fence_proxy_async_shared();
  __syncthreads();
  mbar_wait(bar, 0);

  // The 18 k-steps in groups of `steps_per_group`, each group accumulated by
  // the tensor cores from zero and added to `total` in fp32 (the e4m3 wgmma
  // accumulates with reduced precision: this measures how much promoting
  // partial sums to fp32 recovers).
  float acc[24], total[24];
#pragma unroll
  for (int i = 0; i < 24; ++i) total[i] = 0.f;
  const uint64_t desc_a0 = smem_desc_sw128(k_smem, 16, 1024);
  const uint64_t desc_b0 = smem_desc_sw128(b_smem, 16, 1024);
  for (int ks0 = 0; ks0 < kDims / 32; ks0 += steps_per_group) {
#pragma unroll
    for (int i = 0; i < 24; ++i) acc[i] = 0.f;
    wgmma_fence();
    for (int ks = ks0; ks < ks0 + steps_per_group && ks < kDims / 32; ++ks) {
      wgmma_m64n48k32_e4m3(acc, desc_a0 + (((ks / 4) * kKBlockBytes + (ks % 4) * 32) >> 4),
                           desc_b0 + (((ks / 4) * kBBlockBytes + (ks % 4) * 32) >> 4));
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 24; ++i) total[i] += acc[i];
  }
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 16 * warp + g + 8 * r, h = 8 * j + 2 * c + e;
        const float hi = total[4 * j + 2 * r + e], mid = total[4 * (j + 2) + 2 * r + e], lo = total[4 * (j + 4) + 2 * r + e];
        s_out[key * kHeads + h] = (hi + mid * (1.f / 16.f) + lo * (1.f / 256.f)) * q_scale[h];
      }
    }
  }
#endif
}

}  // namespace

// kv: uint8 codes [rows][row_stride_bytes] (the first 576 bytes of a row used);
// q: bf16 [16][576]; s_out: fp32 [64][16]; steps_per_group: k-steps (of 18)
// per tensor-core accumulation group. Returns a cudaError_t, or -1 when
// the driver's tensor-map encoder is unavailable, -2 when it rejects the map.
extern "C" int tma_qk_probe(const void* kv, long long rows, long long row_stride_bytes, int row0, const void* q,
                            void* s_out, int steps_per_group) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      fn == nullptr) {
    return -1;
  }
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kDims), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride_bytes)};
  const cuuint32_t box[2] = {128, kKeys};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(kv), dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled: error %d\n", static_cast<int>(r));
    return -2;
  }
  cudaFuncSetAttribute(tma_qk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  tma_qk_kernel<<<1, 128, kSmem>>>(map, row0, static_cast<const uint16_t*>(q), static_cast<float*>(s_out),
                                   steps_per_group);
  return static_cast<int>(cudaDeviceSynchronize());
}
