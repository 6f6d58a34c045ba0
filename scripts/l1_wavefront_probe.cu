// How many L1 data-pipe wavefronts a warp's global load costs, per access
// pattern of the Hopper loader warpgroups (sm90/tile_loader_sm90.cuh). Session
// 13's ncu of the narrow kernel found the L1 data pipe (LSU wavefronts: global
// loads, shared stores, wgmma operand reads) 90% busy for fp8 and the code
// loads costing ~476 wavefronts per 64-key tile where 36 KB of codes need 288
// at 128 bytes each; this probe measures the alternatives before the loader is
// changed. Standalone; run under ncu (one kernel launch per pattern):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a scripts/l1_wavefront_probe.cu -o /tmp/l1probe
//   ncu --metrics l1tex__data_pipe_lsu_wavefronts.sum,smsp__sass_inst_executed_op_global_ld.sum,\
//       l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,gpu__time_duration.sum /tmp/l1probe
// Each warp reads one group of 8 consecutive cache rows (the keys of one loader
// warp) with 9 load instructions per thread, as the loader does, and folds the
// loaded words into one store so that nothing is optimised away. Patterns
// (lane l, instruction m):
//   fp8 rows of 576 bytes, 16-byte loads
//     0  key l/4, bytes 16 (l%4) + 64 m                 (the landed loader: 8 keys x 64 B)
//     1  key 4 (m%2) + l/8, bytes 16 (l%8) + 128 (m/2)  (4 keys x 128 B)
//     2  key 2 (m%4) + l/16, bytes 16 (l%16) + 256 (m/4) (2 keys x 256 B)
//     3  key m, bytes 16 l; m = 8: key l/4, bytes 512 + 16 (l%4)  (1 key x 512 B)
//   MXFP4 rows of 288 code bytes, 8-byte loads
//     4  key l/4, bytes 8 (l%4) + 32 m                  (the landed loader: 8 keys x 32 B)
//     5  key m, bytes 8 l; m = 8: key l/4, bytes 256 + 8 (l%4)    (1 key x 256 B)
//   MXFP4 scale rows of 18 bytes, 1-byte loads
//     6  key l/4, byte (l%4 + 4 m) / 2                  (the landed loader)
//     7  key m, byte l / 2 (16 of 18 bytes); m = 8: key l/4, byte 16 + (l%4)/2
// (byte offsets wrap modulo the row length where a pattern overruns a row.)
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

template <int kPattern>
__global__ void probe_kernel(const uint8_t* __restrict__ base, int groups, uint32_t sentinel, uint32_t* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (warp >= groups) return;
  constexpr int kRowBytes = kPattern <= 3 ? 576 : kPattern <= 5 ? 288 : 18;
  const uint8_t* group = base + static_cast<int64_t>(warp) * 8 * kRowBytes;
  uint32_t acc = 0;
#pragma unroll
  for (int m = 0; m < 9; ++m) {
    int key = 0, byte = 0;
    if constexpr (kPattern == 0) { key = lane / 4; byte = 16 * (lane % 4) + 64 * m; }
    if constexpr (kPattern == 1) { key = 4 * (m % 2) + lane / 8; byte = 16 * (lane % 8) + 128 * (m / 2); }
    if constexpr (kPattern == 2) { key = 2 * (m % 4) + lane / 16; byte = 16 * (lane % 16) + 256 * (m / 4); }
    if constexpr (kPattern == 3) { key = m < 8 ? m : lane / 4; byte = m < 8 ? 16 * lane : 512 + 16 * (lane % 4); }
    if constexpr (kPattern == 4) { key = lane / 4; byte = 8 * (lane % 4) + 32 * m; }
    if constexpr (kPattern == 5) { key = m < 8 ? m : lane / 4; byte = m < 8 ? 8 * lane : 256 + 8 * (lane % 4); }
    if constexpr (kPattern == 6) { key = lane / 4; byte = (lane % 4 + 4 * m) / 2; }
    if constexpr (kPattern == 7) { key = m < 8 ? m : lane / 4; byte = m < 8 ? lane / 2 : 16 + (lane % 4) / 2; }
    byte %= kRowBytes;
    const uint8_t* p = group + key * kRowBytes + byte;
    if constexpr (kPattern <= 3) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    } else if constexpr (kPattern <= 5) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      acc ^= v.x ^ v.y;
    } else {
      acc ^= __ldg(p);
    }
  }
  if (acc == sentinel) out[warp] = acc;  // never (the host passes a value no XOR of bytes gives): keeps the loads
}

template <int kPattern>
void run(const uint8_t* buf, int groups, uint32_t* out) {
  const int threads = 256;
  const int blocks = (groups * 32 + threads - 1) / threads;
  probe_kernel<kPattern><<<blocks, threads>>>(buf, groups, 0xFFFFFFFFu, out);
  cudaError_t e = cudaDeviceSynchronize();
  printf("pattern %d: %s\n", kPattern, cudaGetErrorString(e));
}

int main() {
  const int groups = 32768;  // 262144 rows: every pattern reads at most 151 MB
  uint8_t* buf = nullptr;
  uint32_t* out = nullptr;
  const size_t bytes = static_cast<size_t>(groups) * 8 * 576 + 4096;
  if (cudaMalloc(&buf, bytes) != cudaSuccess || cudaMalloc(&out, groups * sizeof(uint32_t)) != cudaSuccess) {
    printf("cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(buf, 0x5a, bytes);  // 9 XORs of such words never give 0xFFFFFFFF
  run<0>(buf, groups, out);
  run<1>(buf, groups, out);
  run<2>(buf, groups, out);
  run<3>(buf, groups, out);
  run<4>(buf, groups, out);
  run<5>(buf, groups, out);
  run<6>(buf, groups, out);
  run<7>(buf, groups, out);
  cudaFree(buf);
  cudaFree(out);
  return 0;
}
