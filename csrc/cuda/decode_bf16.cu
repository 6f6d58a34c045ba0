// Instantiates the split-KV decode kernel for the bf16 cache format.
#include "../mla_decode/portability.h"
#if MLA_PLATFORM_HIP
#include "decode_kernel_mfma.cuh"  // AMD CDNA: MFMA, wave64
#else
#include "decode_kernel.cuh"  // NVIDIA sm_80+: mma.sync
#endif

namespace mla_decode {
namespace cuda {

template cudaError_t launch_split_kernel<KvFormat::kBf16>(const DecodeLaunch&, cudaStream_t);

}  // namespace cuda
}  // namespace mla_decode
