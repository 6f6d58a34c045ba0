// Instantiates the MFMA split kernel for the mxfp4 cache format (one TU per
// format). AMD only: compiled by the hipified (ROCm) build.
#include "common/portability.h"
#if MLA_PLATFORM_HIP
#include "kernels/cdna/mfma_kernel.cuh"

namespace mla_decode {
namespace cuda {

template cudaError_t launch_mfma<KvFormat::kMxfp4>(const DecodeLaunch&, cudaStream_t);

}  // namespace cuda
}  // namespace mla_decode

#endif  // MLA_PLATFORM_HIP
