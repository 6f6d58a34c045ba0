// Instantiates the split-KV decode kernel for the mxfp4 cache format.
#include "decode_kernel.cuh"

namespace mla_decode {
namespace cuda {

template cudaError_t launch_split_kernel<KvFormat::kMxfp4>(const DecodeLaunch&, cudaStream_t);

}  // namespace cuda
}  // namespace mla_decode
