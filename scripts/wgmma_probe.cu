// One wgmma.m64n16k16 (bf16) on operands laid out exactly as the narrow kernel
// (csrc/cuda/sm90/decode_kernel_narrow_sm90.cuh) lays them out, with its
// swizzle (swizzled_offset), so its operand layouts can be checked in
// isolation on an H100/H200
// (scripts/wgmma_probe.py builds this with nvcc and compares with torch):
//   mode 0 (QK):  A = 64 rows (keys) x 16 K, K-major, 128-byte swizzled rows
//                 of a 64-key tile; B = 16 rows (heads) x 16 K, K-major.
//   mode 1 (PV):  A = V^T, M = 64 dims x K = 16 keys, read M-major (the
//                 transpose bit) from a tile whose rows are keys; B = P^T,
//                 16 head rows x 16 keys, K-major.
// Inputs are plain row-major matrices in global memory (mode 0: a[64][16],
// mode 1: v[16 keys][64 dims]; b[16][16] rows = N); the kernel stores them
// into shared memory with the swizzle, runs the wgmma and writes d[64][16]
// (rows = M) from the accumulator layout d[4j + 2r + e] = (row 16 warp + g +
// 8r, column 8j + 2c + e).
#include <cstdint>

#include "../csrc/cuda/sm90/ptx_sm90.cuh"
#include "../csrc/cuda/sm90/tile_loader_sm90.cuh"

using namespace mla_decode::cuda::sm90;

// Byte offset of 16-byte chunk `chunk` (< 8) of row `row` in one 128-byte-row column block.
__device__ __forceinline__ uint32_t sw128(int row, int chunk) { return swizzled_offset(row, chunk, 0); }

__global__ void __launch_bounds__(128) wgmma_probe_kernel(const uint16_t* a_or_v, const uint16_t* b, float* d,
                                                          int mode) {
#if MLA_SM90A_DEVICE
  __shared__ __align__(1024) uint8_t smem[8192 + 2048];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t a_smem = base, b_smem = base + 8192;
  const int tid = threadIdx.x;
  // Zero both blocks, then place the operands.
  for (int i = tid; i < (8192 + 2048) / 4; i += 128) reinterpret_cast<uint32_t*>(smem)[i] = 0;
  __syncthreads();
  if (mode == 0) {
    // A: key row k (0..63), dims 0..15 = chunks 0, 1 of the row.
    for (int i = tid; i < 64 * 16; i += 128) {
      const int row = i / 16, col = i % 16;
      *reinterpret_cast<uint16_t*>(smem + sw128(row, col / 8) + (col % 8) * 2) = a_or_v[i];
    }
  } else {
    // The tile: key row k (0..15), dims 0..63 = chunks 0..7 of the row.
    for (int i = tid; i < 16 * 64; i += 128) {
      const int key = i / 64, dim = i % 64;
      *reinterpret_cast<uint16_t*>(smem + sw128(key, dim / 8) + (dim % 8) * 2) = a_or_v[i];
    }
  }
  // B: 16 rows (N) x 16 K: chunks 0, 1 of each 128-byte row.
  for (int i = tid; i < 16 * 16; i += 128) {
    const int row = i / 16, col = i % 16;
    *reinterpret_cast<uint16_t*>(smem + 8192 + sw128(row, col / 8) + (col % 8) * 2) = b[i];
  }
  fence_proxy_async_shared();
  __syncthreads();
  float acc[8];
  wgmma_fence();
  const uint64_t desc_b = smem_desc_sw128(b_smem, 16, 1024);
  if (mode == 0) {
    wgmma_m64n16k16_ss<false, false, false>(acc, smem_desc_sw128(a_smem, 16, 1024), desc_b);
  } else {
    wgmma_m64n16k16_ss<false, false, true>(acc, smem_desc_sw128(a_smem, 8192, 1024), desc_b);
  }
  wgmma_commit();
  wgmma_wait<0>();
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = i / 4, r = (i / 2) % 2, e = i % 2;
    d[(16 * warp + g + 8 * r) * 16 + 8 * j + 2 * c + e] = acc[i];
  }
#endif
}

extern "C" int wgmma_probe(const void* a_or_v, const void* b, void* d, int mode) {
  wgmma_probe_kernel<<<1, 128>>>(static_cast<const uint16_t*>(a_or_v), static_cast<const uint16_t*>(b),
                                 static_cast<float*>(d), mode);
  return static_cast<int>(cudaDeviceSynchronize());
}
