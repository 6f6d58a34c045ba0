// The benchmark's streaming floor (torch.ops.mla_decode._stream_read): a
// kernel that only reads a buffer once, so a decode call's time can be set
// against the time its cache bytes take to stream under the same protocol.
// Grid-stride 16-byte loads, four per thread in flight, folded by XOR into one
// 64-bit word per block so the loads cannot be dropped; the blocks XOR their
// words into `sink`. NVIDIA only: on a ROCm build this translation unit is
// empty and the operator is not registered.
#include "common/portability.h"
#if !MLA_PLATFORM_HIP

#include "kernels/bench/stream_read.h"

namespace mla_decode {
namespace cuda {

namespace {

constexpr int kStreamThreads = 512;
constexpr int kStreamUnroll = 4;

__global__ void __launch_bounds__(kStreamThreads) stream_read_kernel(const uint4* __restrict__ data, int64_t n16,
                                                                      const uint8_t* __restrict__ tail, int tail_bytes,
                                                                      unsigned long long* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kStreamThreads;
  uint32_t acc = 0;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kStreamThreads + threadIdx.x;
  for (; i + (kStreamUnroll - 1) * stride < n16; i += kStreamUnroll * stride) {
    uint4 v[kStreamUnroll];
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) v[u] = __ldg(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldg(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (blockIdx.x == 0 && threadIdx.x < tail_bytes) acc ^= tail[threadIdx.x];
  for (int offset = MLA_WARP_SIZE / 2; offset > 0; offset /= 2) acc ^= mla_shfl_xor(acc, offset);
  if (threadIdx.x % MLA_WARP_SIZE == 0 && acc != 0) atomicXor(sink, static_cast<unsigned long long>(acc));
}

}  // namespace

cudaError_t launch_stream_read(const void* data, int64_t bytes, int num_sms, unsigned long long* sink,
                               cudaStream_t stream) {
  const int64_t n16 = bytes / 16;
  const int tail_bytes = static_cast<int>(bytes - n16 * 16);
  const int64_t wanted = (n16 + static_cast<int64_t>(kStreamThreads) * kStreamUnroll - 1) /
                         (static_cast<int64_t>(kStreamThreads) * kStreamUnroll);
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * 4;  // four 512-thread blocks per SM
  const unsigned blocks = static_cast<unsigned>(wanted < 1 ? 1 : (wanted < cap ? wanted : cap));
  stream_read_kernel<<<blocks, kStreamThreads, 0, stream>>>(static_cast<const uint4*>(data), n16,
                                                           static_cast<const uint8_t*>(data) + n16 * 16, tail_bytes,
                                                           sink);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP
