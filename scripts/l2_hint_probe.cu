// Does an L2 eviction hint on the KV stream pay after a flush that leaves L2
// full of dirty lines, and which cp.async forms does ptxas compile correctly?
//
// The competition's flush writes 256 MB (L2 ends full of dirty lines); a call
// that then reads R bytes evicts up to min(R, L2) dirty lines, each a DRAM
// write. This probe streams R bytes from 128 CTAs (one per SM, a 4-stage
// 16 KB cp.async ring each, the decode kernels' access pattern) after
//   a write flush (memset of 256 MB) or a read flush (a kernel reading it),
// with the copies issued as
//   plain     cp.async.cg (no hint)
//   policy    cp.async.cg .L2::cache_hint, policy from createpolicy (evict_first)
//   ignore    the same with the ignore-src predicate form instead of src-size
//   tma       cp.async.bulk (the TMA unit, one 16 KB copy per stage) with the
//             createpolicy evict_first policy
//   tma_plain cp.async.bulk without a hint
//   plain8, tma8, tma_plain8: the same on 132 CTAs with an 8-stage (128 KB) ring
// One variant per process (an illegal instruction kills the context):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc scripts/l2_hint_probe.cu -o /tmp/l2probe
//   for v in plain policy ignore tma tma_plain; do /tmp/l2probe $v 37748736; done
// Prints the checksum (equal for every variant that is correct) and the mean
// kernel time (us) of 20 calls after each kind of flush.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "cuda/ptx_sm80.cuh"
#include "cuda/sm90/ptx_sm90.cuh"

using namespace mla_decode::cuda;
using namespace mla_decode::cuda::sm90;

constexpr int kThreads = 256;
constexpr int kStageBytes = kThreads * 16 * 4;  // 16 KB: 4 x 16 B per thread

enum Variant { kPlain, kPolicy, kIgnore, kTma, kTmaPlain };

template <int V, int kStages>
__global__ void __launch_bounds__(kThreads) stream(const uint8_t* src, int64_t bytes_per_cta, uint32_t* sums) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[kStages];
  const uint8_t* base = src + blockIdx.x * bytes_per_cta;
  const int n_stages = static_cast<int>(bytes_per_cta / kStageBytes);
  const uint64_t pol = l2_evict_first_policy();  // the decode kernels' policy (ptx_sm90.cuh)
  const int tid = threadIdx.x;
  if (V == kTma || V == kTmaPlain) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(smem_u32(&bars[s]), 1);
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  auto issue = [&](int st) {
    const int slot = st % kStages;
    const uint8_t* g = base + static_cast<int64_t>(st) * kStageBytes;
    const uint32_t s = smem_u32(smem + slot * kStageBytes);
    if constexpr (V == kTma || V == kTmaPlain) {
      if (tid == 0) {
        const uint32_t bar = smem_u32(&bars[slot]);
        mbar_arrive_expect_tx(bar, kStageBytes);
        if constexpr (V == kTma) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
              "%4;\n" ::"r"(s),
              "l"(g), "r"(kStageBytes), "r"(bar), "l"(pol)
              : "memory");
        } else {
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                           s),
                       "l"(g), "r"(kStageBytes), "r"(bar)
                       : "memory");
        }
      }
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const uint32_t d = s + (m * kThreads + tid) * 16;
        const uint8_t* a = g + (m * kThreads + tid) * 16;
        if constexpr (V == kPlain) {
          cp_async_16(d, a, 16);
        } else if constexpr (V == kPolicy) {
          asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(d), "l"(a), "r"(16),
                       "l"(pol));
        } else {
          asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\ncp.async.cg.shared.global.L2::cache_hint [%0], [%1], "
                       "16, q, %3;\n}\n" ::"r"(d),
                       "l"(a), "r"(0), "l"(pol));
        }
      }
      cp_async_commit();
    }
  };
  for (int st = 0; st < kStages - 1 && st < n_stages; ++st) issue(st);
  uint32_t acc = 0;
  for (int st = 0; st < n_stages; ++st) {
    if (st + kStages - 1 < n_stages) {
      issue(st + kStages - 1);
    } else if (V != kTma && V != kTmaPlain) {
      cp_async_commit();
    }
    if constexpr (V == kTma || V == kTmaPlain) {
      mbar_wait(smem_u32(&bars[st % kStages]), (st / kStages) & 1);
    } else {
      cp_async_wait<kStages - 1>();
      __syncthreads();
    }
    const uint32_t* w = reinterpret_cast<const uint32_t*>(smem + (st % kStages) * kStageBytes);
#pragma unroll
    for (int m = 0; m < 16; ++m) acc += w[m * kThreads + tid];
    __syncthreads();  // the slot is refilled next iteration
  }
  atomicAdd(sums, acc);
}

__global__ void read_flush(const uint4* buf, int64_t n, uint32_t* sink) {
  uint32_t a = 0;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = buf[i];
    a ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (a == 0x12345678u) *sink = a;
}

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e = (x);                                                                        \
    if (e != cudaSuccess) {                                                                     \
      printf("%-10s CUDA error at %s: %s\n", name, #x, cudaGetErrorString(e));                  \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

template <int V, int kStages = 4>
int run(const char* name, int64_t bytes, int ctas = 128) {
  int64_t per_cta = bytes / ctas / kStageBytes * kStageBytes;
  if (per_cta < kStageBytes) per_cta = kStageBytes;
  const int64_t flush_bytes = 256ll << 20;
  uint8_t *src, *flush;
  uint32_t *sums, *sink;
  CK(cudaMalloc(&src, per_cta * ctas));
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMalloc(&sums, 4));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(src, 0x5a, per_cta * ctas));
  const int smem = kStages * kStageBytes;
  CK(cudaFuncSetAttribute(stream<V, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float ms_total[2] = {0, 0};
  const int reps = 20;
  uint32_t sum = 0;
  for (int kind = 0; kind < 2; ++kind) {
    for (int r = 0; r < reps + 2; ++r) {
      if (kind == 0) {
        CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
      } else {
        read_flush<<<528, 512>>>(reinterpret_cast<const uint4*>(flush), flush_bytes / 16, sink);
      }
      CK(cudaMemsetAsync(sums, 0, 4));
      CK(cudaEventRecord(a));
      stream<V, kStages><<<ctas, kThreads, smem>>>(src, per_cta, sums);
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      CK(cudaGetLastError());
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (r >= 2) ms_total[kind] += ms;
      CK(cudaMemcpy(&sum, sums, 4, cudaMemcpyDeviceToHost));
    }
  }
  const double mb = per_cta * ctas / 1e6;
  const double us_w = 1e3 * ms_total[0] / reps, us_r = 1e3 * ms_total[1] / reps;
  printf("%-10s %8.1f MB  checksum %08x  after write flush %7.2f us (%5.2f TB/s)  after read flush %7.2f us (%5.2f TB/s)\n",
         name, mb, sum, us_w, mb / us_w, us_r, mb / us_r);
  return 0;
}

int main(int argc, char** argv) {
  const char* v = argc > 1 ? argv[1] : "plain";
  const int64_t bytes = argc > 2 ? atoll(argv[2]) : 37748736;
  if (!strcmp(v, "plain")) return run<kPlain>(v, bytes);
  if (!strcmp(v, "policy")) return run<kPolicy>(v, bytes);
  if (!strcmp(v, "ignore")) return run<kIgnore>(v, bytes);
  if (!strcmp(v, "tma")) return run<kTma>(v, bytes);
  if (!strcmp(v, "tma_plain")) return run<kTmaPlain>(v, bytes);
  // The streaming floor: one CTA per SM, an 8-stage (128 KB) ring.
  if (!strcmp(v, "plain8")) return run<kPlain, 8>(v, bytes, 132);
  if (!strcmp(v, "tma8")) return run<kTma, 8>(v, bytes, 132);
  if (!strcmp(v, "tma_plain8")) return run<kTmaPlain, 8>(v, bytes, 132);
  printf("unknown variant %s\n", v);
  return 2;
}
