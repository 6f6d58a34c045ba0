// The benchmark's streaming floor: see stream_read.cu.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace mla_decode {
namespace cuda {

// Reads `bytes` bytes at `data` (16-byte aligned) once on `stream`, XOR-ing
// them into *sink (a device word). At most four 512-thread blocks per SM.
cudaError_t launch_stream_read(const void* data, int64_t bytes, int num_sms, unsigned long long* sink,
                               cudaStream_t stream);

}  // namespace cuda
}  // namespace mla_decode
