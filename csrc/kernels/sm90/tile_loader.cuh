// Pieces shared by the Hopper wide and narrow kernels (wide_kernel.cuh,
// narrow_kernel.cuh, narrow_register_v_kernel.cuh): the 128-byte swizzle of
// their wgmma operands, the per-head power-of-two scaling of Q for OCP fp8
// caches, the loader warpgroups' map of a 64-key tile of fp8 / MXFP4 codes
// onto 256 threads, and a head's LSE store.
#pragma once

#include <math_constants.h>

#include "common/addressing.h"
#include "common/params.h"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/launch_contract.h"
#include "kernels/common/work.cuh"
#include "kernels/sm80/ptx_sm80.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {

// Byte offset of 16-byte chunk `chunk` of row `row` in a K-major operand of
// column blocks of `block_bytes` (64 16-bit elements = 128 bytes per row),
// with the 128-byte swizzle: chunk c of row r sits at position c ^ (r % 8).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk, int block_bytes) {
  return (chunk >> 3) * block_bytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// The largest finite |x| of 8 bf16 (bits, as integers) folded into amax.
__device__ __forceinline__ uint32_t bf16x8_finite_abs_max(const uint4& v, uint32_t amax) {
  amax = bf16_finite_abs_max(v.x, amax);
  amax = bf16_finite_abs_max(v.y, amax);
  amax = bf16_finite_abs_max(v.z, amax);
  return bf16_finite_abs_max(v.w, amax);
}

// The power-of-two scale of Q row `row`, whose elements kThreadsPerRow
// consecutive lanes share (lane c passes the bf16 bits of its largest finite
// |q|): returns 2^e with max |q| 2^e in [2^(kTopBiased - 127), 2^(kTopBiased
// - 126)) and stores 2^-e into q_scale[row] (lane c == 0).
template <int kThreadsPerRow, int kTopBiased>
__device__ __forceinline__ float q_row_pow2_scale(uint32_t amax, int row, int c, float* q_scale) {
#pragma unroll
  for (int lanes = 1; lanes < kThreadsPerRow; lanes *= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, lanes));
  const int e = pow2_scale_exponent<kTopBiased>(amax);
  if (c == 0) q_scale[row] = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

// OCP fp8: Q row `row` (576 bf16 already in shared memory, swizzled) to f16
// scaled by 2^e per head, max |q| * 2^e in [2^14, 2^15), so that products
// with e4m3 codes (|k| <= 448) stay far inside fp32. kThreadsPerRow threads
// (consecutive lanes) share the row: thread c converts chunks c +
// kThreadsPerRow m, the ones its own cp.async copied (no barrier before).
// inf / NaN elements are left out of the maximum and stay inf / NaN in f16.
// One thread per row stores 2^-e into q_scale[row].
template <int kThreadsPerRow>
__device__ __forceinline__ void scale_q_row_to_f16(uint32_t q_smem, int row, int c, int block_bytes, float* q_scale) {
  static_assert(kThreadsPerRow == 2 || kThreadsPerRow == 8, "lanes of a row: 2 (wide) or 8 (narrow)");
  constexpr int kChunks = kHeadDimQK / 8 / kThreadsPerRow;
  uint32_t amax = 0;  // bf16 bits of the largest finite |q| (compare as integers)
#pragma unroll
  for (int m = 0; m < kChunks; ++m) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(q_smem + swizzled_offset(row, c + kThreadsPerRow * m, block_bytes)));
    amax = bf16x8_finite_abs_max(v, amax);
  }
  const float factor = q_row_pow2_scale<kThreadsPerRow, 141>(amax, row, c, q_scale);  // max |q| 2^e in [2^14, 2^15)
#pragma unroll
  for (int m = 0; m < kChunks; ++m) {
    const uint32_t addr = q_smem + swizzled_offset(row, c + kThreadsPerRow * m, block_bytes);
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h =
          __floats2half2_rn(__uint_as_float(w[i] << 16) * factor, __uint_as_float(w[i] & 0xFFFF0000u) * factor);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    st_shared_v4(addr, w);
  }
}

// The loader warpgroups' map of a 64-key tile: thread lt (0..255) handles key
// lt / 4 and the 16-code chunks j = lt % 4 + 4m (m = 0..8; dims 16j..16j+15),
// so a warp reads 8 keys x 64 contiguous bytes (fp8) per instruction.
// The split's last 64-key tile, stored as 8 + 1 column blocks of 64 rows x
// 128 bytes (`block_bytes` apart): zeroes dims 0..511 of rows [valid, 64),
// which a TMA form landed from past the split (another item's keys, or NaN:
// PV multiplies every row by its P, and 0 x NaN reaches O). 128 threads, tid
// 0..127; the caller's proxy fence before its next hand-off covers the stores.
__device__ __forceinline__ void zero_rows_past_split(uint32_t stage, int valid, int tid, int block_bytes) {
  constexpr int kTileRows = 64;
  if (valid < kTileRows) {
    for (int i = tid; i < (kTileRows - valid) * 64; i += 128) {  // 8 column blocks x 8 chunks per row
      const uint32_t addr = stage + (i % 64 / 8) * block_bytes + (valid + i / 64) * 128 + (i % 8) * 16;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
    }
  }
}

constexpr int kLoaderThreads = 256;
constexpr int kLoaderTileTokens = 64;
constexpr int kLoadersPerToken = kLoaderThreads / kLoaderTileTokens;  // 4
constexpr int kCodeChunks = kHeadDimQK / 16 / kLoadersPerToken;       // 9

struct TileCodeLoader {
  const MlaDecodeParams& p;
  const uint8_t* kv_base;   // p.kv
  int b;                    // batch item
  int kv_begin, kv_end;     // the split's keys
  int ld_token, ld_c0;      // this thread's key of a tile and first chunk
  bool contiguous;          // indptr layout: rows kv_indptr[b] + j
  int64_t contiguous_base;  // kv_indptr[b] (0 for an orphan token)

  // Cache row of this thread's key of `tile`: -2 past the split (zero codes,
  // masked by position), -1 for a bad index (zero codes, a NaN score).
  __device__ __forceinline__ int64_t key_row(int tile) const {
    const int j = kv_begin + tile * kLoaderTileTokens + ld_token;
    if (j >= kv_end) return -2;
    const int64_t r = contiguous ? contiguous_base + j : kv_row(p, b, j);
    return (r < 0 || r >= p.num_cache_rows) ? -1 : r;
  }

  // The codes of cache row r (zeros for r < 0) into registers, by the map
  // above. fp8: chunk m is 16 codes (16 bytes).
  __device__ __forceinline__ void fetch_codes(int64_t r, uint4 (&codes)[kCodeChunks]) const {
    const uint8_t* src = kv_base + (r >= 0 ? r : 0) * p.kv_row_stride_bytes + 16 * ld_c0;
#pragma unroll
    for (int m = 0; m < kCodeChunks; ++m) {
      codes[m] = r >= 0 ? __ldg(reinterpret_cast<const uint4*>(src + 64 * m)) : make_uint4(0, 0, 0, 0);
    }
  }
  // MXFP4: chunk m is 16 codes (8 bytes), with the E8M0 byte of its block
  // (chunk j is half of block j / 2).
  __device__ __forceinline__ void fetch_mx(int64_t r, uint2 (&mx_codes)[kCodeChunks],
                                           uint32_t (&mx_e)[kCodeChunks]) const {
    const uint8_t* src = kv_base + (r >= 0 ? r : 0) * p.kv_row_stride_bytes + 8 * ld_c0;
    const uint8_t* sc = p.mx_scale + (r >= 0 ? r : 0) * p.mx_scale_stride_row;
#pragma unroll
    for (int m = 0; m < kCodeChunks; ++m) {
      const int blk = (ld_c0 + 4 * m) >> 1;
      mx_codes[m] = r >= 0 ? __ldg(reinterpret_cast<const uint2*>(src + 32 * m)) : make_uint2(0, 0);
      mx_e[m] = r >= 0 ? __ldg(sc + blk * p.mx_scale_stride_col) : 0u;
    }
  }

  // MXFP4 by pairs of chunks (the narrow kernel's map, narrow_kernel.cuh):
  // chunks j0 + 4t and j0 + 4t + 1 (t = 0..2, j0 even) of cache row r, one
  // 16-byte load each (32 codes, dims 32 (j0 / 2 + 2t) ..: MX block j0 / 2 +
  // 2t), and that block's E8M0 byte; zeros for r < 0. The rows are 16-byte
  // aligned (the Hopper kernels' condition), so the loads are too.
  __device__ __forceinline__ void fetch_mx_pairs(int64_t r, int j0, uint4 (&pairs)[3], uint32_t (&mx_e)[3]) const {
    const uint8_t* src = kv_base + (r >= 0 ? r : 0) * p.kv_row_stride_bytes + 8 * j0;
    const uint8_t* sc = p.mx_scale + (r >= 0 ? r : 0) * p.mx_scale_stride_row;
#pragma unroll
    for (int t = 0; t < 3; ++t) {
      pairs[t] = r >= 0 ? __ldg(reinterpret_cast<const uint4*>(src + 32 * t)) : make_uint4(0, 0, 0, 0);
      mx_e[t] = r >= 0 ? __ldg(sc + (j0 / 2 + 2 * t) * p.mx_scale_stride_col) : 0u;
    }
  }
};

}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode
