// Instantiates the split-KV decode kernel for the bf16 cache format.
#include "decode_kernel.cuh"

namespace mla_decode {
namespace cuda {

template cudaError_t launch_split_kernel<KvFormat::kBf16>(const DecodeLaunch&, cudaStream_t);

}  // namespace cuda
}  // namespace mla_decode
