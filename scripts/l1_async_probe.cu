// What the SM's L1 data pipe (ncu: l1tex__data_pipe_lsu_wavefronts) pays for
// the operations a next narrow kernel would be built from (session 13: the
// landed narrow kernel is bound by that pipe, docs/performance.md run101):
//   kernel 0  bulk copies (cp.async.bulk, the TMA unit) of 64 KB into shared
//             memory per iteration: do they take LSU wavefronts at all?
//   kernel 1  36 x wgmma m64n16k16 bf16, A K-major (QK's form: a 64-key x
//             576-dim tile), B = 16 x 16 K-major
//   kernel 2  32 x wgmma m64n16k16 bf16, A read M-major (PV's V^T form)
//   kernel 3  18 x wgmma m64n32k32 e4m3 (QK on fp8 K, Q as two terms along N)
//   kernel 4  18 x wgmma m64n16k32 e4m3
//   kernel 5  72 KB of st.shared.v4 by 128 threads (the producers' tile store)
// One CTA of 128 threads per SM, 200 iterations each; operands are whatever
// shared memory holds (only the traffic is measured). Standalone, sm_90a:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc scripts/l1_async_probe.cu -o /tmp/asyncprobe
//   ncu --metrics l1tex__data_pipe_lsu_wavefronts.sum,l1tex__data_bank_reads.sum,l1tex__data_bank_writes.sum,\
//       sm__cycles_elapsed.avg,gpu__time_duration.sum /tmp/asyncprobe
// Per operation: wavefronts / (132 CTAs x 200 iterations x operations per
// iteration); cycles per operation from sm__cycles_elapsed.avg / 200 / ops.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "cuda/ptx_sm80.cuh"
#include "cuda/sm90/ptx_sm90.cuh"

using namespace mla_decode::cuda;
using namespace mla_decode::cuda::sm90;

constexpr int kIters = 200;
constexpr int kCtas = 132;
constexpr int kSmemBytes = 8 * 9 * 1024 * 2 + 32 * 1024;  // 144 KB of tiles + B operands

__device__ __forceinline__ void keep(const float* d, int n, uint32_t sentinel, uint32_t* out) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += d[i];
  if (__float_as_uint(s) == sentinel) out[blockIdx.x] = 1u;
}

template <int kKernel>
__global__ void __launch_bounds__(128, 1) probe(const uint8_t* __restrict__ src, uint32_t sentinel, uint32_t* out) {
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = smem_u32(smem);
  const uint32_t b_smem = base + 8 * 9 * 1024 * 2;  // B operands past the tiles
  const uint32_t bar = b_smem + 30 * 1024;
  if constexpr (kKernel == 0) {
    if (threadIdx.x == 0) mbar_init(bar, 1);
    __syncthreads();
    for (int it = 0; it < kIters; ++it) {
      if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(65536) : "memory");
        const uint8_t* from = src + (static_cast<size_t>(blockIdx.x) * kIters + it) % 2048 * 65536;
        for (int c = 0; c < 16; ++c) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                  base + 4096 * c),
              "l"(from + 4096 * c), "r"(4096), "r"(bar)
              : "memory");
        }
      }
      mbar_wait(bar, it & 1);
    }
  } else if constexpr (kKernel == 1 || kKernel == 2) {
    float d[8] = {};
    const uint64_t desc_b = smem_desc_sw128(b_smem, 16, 1024);
    for (int it = 0; it < kIters; ++it) {
      const uint32_t tile = base + (it & 1) * 9 * 8192;
      wgmma_fence();
      if constexpr (kKernel == 1) {
        const uint64_t desc_a = smem_desc_sw128(tile, 16, 1024);
#pragma unroll
        for (int ks = 0; ks < 36; ++ks) {
          wgmma_m64n16k16_ss<false, true, false>(d, desc_a + (((ks / 4) * 8192 + (ks % 4) * 32) >> 4),
                                                 desc_b + (((ks % 4) * 32) >> 4));
        }
      } else {
        const uint64_t desc_a = smem_desc_sw128(tile, 8192, 1024);
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            wgmma_m64n16k16_ss<false, true, true>(d, desc_a + ((mb * 8192 + kk * 16 * 128) >> 4),
                                                  desc_b + ((32 * kk) >> 4));
          }
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
    }
    keep(d, 8, sentinel, out);
  } else if constexpr (kKernel == 3 || kKernel == 4) {
    float d[16] = {};
    const uint64_t desc_b = smem_desc_sw128(b_smem, 16, 1024);
    for (int it = 0; it < kIters; ++it) {
      const uint32_t tile = base + (it & 1) * 5 * 8192;
      const uint64_t desc_a = smem_desc_sw128(tile, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 18; ++ks) {
        const uint64_t a = desc_a + (((ks / 4) * 8192 + (ks % 4) * 32) >> 4);
        const uint64_t b = desc_b + (((ks % 4) * 32) >> 4);
        if constexpr (kKernel == 3) {
          wgmma_m64n32k32_e4m3_ss<true>(d, a, b);
        } else {
          wgmma_m64n16k32_e4m3_ss<true>(reinterpret_cast<float(&)[8]>(d), a, b);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
    }
    keep(d, kKernel == 3 ? 16 : 8, sentinel, out);
  } else {
    const uint32_t t = threadIdx.x;
    for (int it = 0; it < kIters; ++it) {
      const uint32_t tile = base + (it & 1) * 9 * 8192;
      // The producers' map: thread t stores 16-byte chunks 2 (t % 4) and + 1 of
      // row t / 4 (+ 32 in the second pass) in each of 9 column blocks.
#pragma unroll
      for (int blk = 0; blk < 9; ++blk) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const uint32_t row = t / 4 + 32 * (m / 2), chunk = 2 * (t % 4) + (m % 2);
          const uint32_t addr = tile + blk * 8192 + row * 128 + ((chunk ^ (row & 7)) << 4);
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(it), "r"(t), "r"(m), "r"(blk)
                       : "memory");
        }
      }
      __syncwarp();
    }
  }
#endif
}

template <int kKernel>
void run(const uint8_t* src, uint32_t* out) {
  cudaFuncSetAttribute(probe<kKernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  probe<kKernel><<<kCtas, 128, kSmemBytes>>>(src, 0xFFFFFFFFu, out);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("kernel %d: %s\n", kKernel, cudaGetErrorString(e));
}

int main() {
  uint8_t* src = nullptr;
  uint32_t* out = nullptr;
  if (cudaMalloc(&src, 2048ull * 65536 + 65536) != cudaSuccess || cudaMalloc(&out, kCtas * 4) != cudaSuccess) {
    printf("cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(src, 0, 2048ull * 65536 + 65536);
  run<0>(src, out);
  run<1>(src, out);
  run<2>(src, out);
  run<3>(src, out);
  run<4>(src, out);
  run<5>(src, out);
  return 0;
}
