// Pieces shared by the Hopper wide kernels (H >= 64, 64 heads per CTA):
// wide_kernel.cuh (fp8, MXFP4, and bf16 on layouts TMA cannot address) and
// wide_tma_kernel.cuh (bf16 tiles landed by TMA). In both, one score
// warpgroup holds S of 64 heads x a tile's keys as the wgmma accumulator
// (s[4i + 2r + e] = row 16 warp + g + 8r, key 8i + 2c + e) and runs the
// online softmax with lazy rescaling; two value warpgroups hold O, each its
// 256 value dims as the m64n256 accumulator (o[4i + 2r + e] = row 16 warp + g
// + 8r, dim 256 vwg + 8i + 2c + e).
//
// The epilogue writes O / l as bf16 out (one split) or as fp32 partials
// (several; launch_contract.h). Each thread holds two rows x 64 dims; written
// straight to global memory that is 64 stores of 4 or 8 bytes per thread,
// each warp store touching 8 rows: ~12k cycles per CTA at 1 split (trace
// build, B = 64, kv 1024). So the rows go through free shared memory (padded
// rows, no bank conflicts) and leave as 16-byte stores of consecutive threads
// (full 128-byte lines).
#pragma once

#include <cuda_fp16.h>
#include <math_constants.h>

#include "common/params.h"
#include "kernels/common/launch_contract.h"
#include "kernels/common/work.cuh"
#include "kernels/sm80/ptx_sm80.cuh"
#include "kernels/sm90/ptx_sm90.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {

constexpr int kWideValueThreads = 256;  // the two value warpgroups
// The staging rows (per value warpgroup: 64 rows of its 256 dims), padded by
// 16 / 32 bytes so that the 8 rows of a warp's store fall on different banks.
constexpr int kWideOutRowBf16 = 256 * 2 + 16;  // 528
constexpr int kWideOutRowF32 = 256 * 4 + 32;   // 1056
constexpr int kWideStageOutBytes = 2 * kWideRows * kWideOutRowF32;  // what `stage_out` must hold

// Lazy rescaling (log2 domain), as in the narrow kernels: the running
// reference m_run moves only when a tile's maximum exceeds it by more than
// this, so P = exp2(s - m_run) <= 2^8 (exact enough in bf16 / f16, far from
// overflow) and most tiles need no O rescale in the value warpgroups.
constexpr float kWideLazyLog2 = 8.f;

// One tile's softmax step for a score thread's two rows: s holds the raw
// scores (masked: -inf past the split, NaN for a bad key), mx their maxima
// over this thread's columns, row_scale the score scale in the log2 domain
// (positive, so the maximum is the same key). Moves the reference m_run
// lazily (the quad's row maximum is formed only when some score of the warp
// exceeds its reference by more than kWideLazyLog2; NaN compares false, so a
// NaN row keeps its reference and stays NaN), returns the rows' rescale
// factors alpha (1: unchanged), adds the tile to l_run (this thread's
// columns; the quad's sum is formed at the end) and packs P = exp2(s scale -
// m_run) as 16-bit pairs: pk[2i + r] = keys 8i + 2c, +1 of row r (f16 with
// kF16, else bf16).
template <bool kF16, int kAcc>
__device__ __forceinline__ void wide_softmax_tile(const float (&s)[kAcc], float (&mx)[2], const float (&row_scale)[2],
                                                  float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                                  uint32_t (&pk)[kAcc / 2]) {
  mx[0] *= row_scale[0];
  mx[1] *= row_scale[1];
  alpha[0] = alpha[1] = 1.f;
  if (__any_sync(0xffffffffu, mx[0] > m_run[0] + kWideLazyLog2 || mx[1] > m_run[1] + kWideLazyLog2)) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (mx[r] > m_run[r] + kWideLazyLog2) {  // the same for the row's four threads
        alpha[r] = exp2f(m_run[r] - mx[r]);
        m_run[r] = mx[r];
      }
    }
  }
  // -inf only while every key so far is masked: any finite reference
  // then gives p = 0 and keeps O and l at 0.
  const float m_ref[2] = {m_run[0] == -CUDART_INF_F ? 0.f : m_run[0], m_run[1] == -CUDART_INF_F ? 0.f : m_run[1]};
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kAcc / 4; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float p0 = exp2f(fmaf(s[4 * i + 2 * r], row_scale[r], -m_ref[r]));
      const float p1 = exp2f(fmaf(s[4 * i + 2 * r + 1], row_scale[r], -m_ref[r]));
      sum[r] += p0 + p1;
      if constexpr (kF16) {
        const __half2 h = __floats2half2_rn(p0, p1);
        pk[2 * i + r] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        pk[2 * i + r] = mla_pack_bf16x2(p0, p1);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
}

// P (A of PV: 64 heads x the tile's keys, K-major, 16-bit, in one
// 128-byte-swizzled column block of 64 rows at p_smem; a 32-key tile uses
// chunks 0-3 of each row). pk[2i + r] holds keys 8i + 2c, +1 of row 16 warp +
// g + 8r: the m8n8 fragment (rows 16 warp + 8r .., keys 8i ..) in the mma
// layout, so one stmatrix stores four of them: matrix m = lane / 8 is (i0 + m
// / 2, r = m % 2), and lane gives the address of its row lane % 8.
template <int kKeyChunks>
__device__ __forceinline__ void store_p(uint32_t p_smem, const uint32_t (&pk)[2 * kKeyChunks], int warp, int lane) {
  const int mat = lane >> 3, row = 16 * warp + 8 * (mat & 1) + (lane & 7);
#pragma unroll
  for (int i0 = 0; i0 < kKeyChunks; i0 += 2) {
    const int chunk = i0 + (mat >> 1);
    const uint32_t addr = p_smem + row * 128 + ((chunk ^ (row & 7)) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(pk[2 * i0]),
                 "r"(pk[2 * i0 + 1]), "r"(pk[2 * i0 + 2]), "r"(pk[2 * i0 + 3])
                 : "memory");
  }
}

// Accumulator row r0 + 8r's output factor: out_scale / l (0 for l = 0, an
// empty split), NaN for a NaN sum or an orphan token. out_scale is the cache's
// dequantisation factor of V (1 for bf16 and MXFP4).
__device__ __forceinline__ void wide_output_factors(const float* final_l, int r0, float out_scale, bool orphan,
                                                    float (&inv)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = final_l[r0 + 8 * r];
    inv[r] = (l > 0.f ? 1.f / l : 0.f) * out_scale;
    if (isnan(l) || orphan) inv[r] = CUDART_NAN_F;
  }
}

// O * inv of value warpgroup vwg (thread lt = 0..255 of the two; accumulator
// rows r0 = 16 warp + g and r0 + 8, column pair 2c) to out or to this split's
// partial rows. stage_out: kWideStageOutBytes of shared memory that no one
// reads or writes any more; bar_id: a named barrier of the 256 value threads.
__device__ __forceinline__ void store_wide_output(const DecodeLaunch& args, const WorkItem& work, const float (&o)[128],
                                                  const float (&inv)[2], uint8_t* stage_out, int vwg, int lt, int r0,
                                                  int c, int bar_id) {
  const MlaDecodeParams& p = args.p;
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const bool partials = args.num_splits > 1;
  // bf16 out takes 16-byte stores only where its rows are 16-byte aligned.
  const bool staged = partials || ((reinterpret_cast<uintptr_t>(p.out) & 15) == 0 && p.out_stride_token % 8 == 0 &&
                                   p.out_stride_head % 8 == 0);
  if (staged) {
    if (!partials) {
      uint8_t* const half = stage_out + vwg * kWideRows * kWideOutRowBf16;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          *reinterpret_cast<uint32_t*>(half + (r0 + 8 * r) * kWideOutRowBf16 + (8 * i + 2 * c) * 2) =
              mla_pack_bf16x2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
        }
      }
    } else {
      uint8_t* const half = stage_out + vwg * kWideRows * kWideOutRowF32;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          *reinterpret_cast<float2*>(half + (r0 + 8 * r) * kWideOutRowF32 + (8 * i + 2 * c) * 4) =
              make_float2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
        }
      }
    }
    bar_sync(bar_id, kWideValueThreads);  // both halves of every row staged
    // 16-byte chunk j of row `row`: chunks of one row are consecutive threads.
    if (!partials) {
      constexpr int kChunks = kHeadDimV * 2 / 16;  // 64 per row
#pragma unroll 4
      for (int j = lt; j < kWideRows * kChunks; j += kWideValueThreads) {
        const int row = j / kChunks, chunk = j % kChunks, h = work.h0 + row;
        if (h >= p.num_heads) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(stage_out + (chunk / (kChunks / 2)) * kWideRows * kWideOutRowBf16 +
                                                        row * kWideOutRowBf16 + (chunk % (kChunks / 2)) * 16);
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                                  static_cast<int64_t>(h) * p.out_stride_head + 8 * chunk) = v;
      }
    } else {
      constexpr int kChunks = kHeadDimV * 4 / 16;  // 128 per row
#pragma unroll 4
      for (int j = lt; j < kWideRows * kChunks; j += kWideValueThreads) {
        const int row = j / kChunks, chunk = j % kChunks, h = work.h0 + row;
        if (h >= p.num_heads) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(stage_out + (chunk / (kChunks / 2)) * kWideRows * kWideOutRowF32 +
                                                        row * kWideOutRowF32 + (chunk % (kChunks / 2)) * 16);
        const int64_t out_row = static_cast<int64_t>(work.t) * p.num_heads + h;
        *reinterpret_cast<uint4*>(args.partial_out + (static_cast<int64_t>(work.split) * rows + out_row) * kHeadDimV +
                                  4 * chunk) = v;
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = work.h0 + r0 + 8 * r;
      if (h >= p.num_heads) continue;  // no shuffles below: skipping is safe
      uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                      static_cast<int64_t>(h) * p.out_stride_head + 256 * vwg + 2 * c;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        *reinterpret_cast<uint32_t*>(dst + 8 * i) = mla_pack_bf16x2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
      }
    }
  }
}

}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode
