// Instantiates the mma.sync split kernel for the mxfp4 cache format (one TU per
// format, so the formats compile in parallel). NVIDIA only.
#include "common/portability.h"
#if !MLA_PLATFORM_HIP
#include "kernels/sm80/mma_sync_kernel.cuh"

namespace mla_decode {
namespace cuda {

template cudaError_t launch_mma_sync<KvFormat::kMxfp4>(const DecodeLaunch&, cudaStream_t);

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP
