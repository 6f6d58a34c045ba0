// Host entry points of the GPU kernels. Plain C++ (no ATen): the dispatcher
// (csrc/api/dispatch_cuda.cpp) validates tensors, fills MlaDecodeParams,
// plans (csrc/plan), allocates the split workspace and calls these.
#pragma once

#include <cuda_runtime.h>

#include "common/params.h"
#include "plan/plan.h"

namespace mla_decode {
namespace cuda {

// Launches the plan's split kernel and, when plan.num_splits > 1, the combine
// kernel on `stream`. `workspace` must hold plan::workspace_bytes() (16-byte
// aligned). Returns the first launch error (cudaSuccess otherwise).
cudaError_t launch_decode(const MlaDecodeParams& p, const plan::Plan& plan, void* workspace,
                          cudaStream_t stream);

// What this build and driver offer the plan (plan::DeviceFacts), asked once
// per device by the dispatcher: whether the build holds sm_90a machine code
// (the Hopper kernels), and whether the driver encodes TMA tensor maps.
bool built_with_sm90a_kernels();
bool driver_encodes_tensor_maps();

}  // namespace cuda
}  // namespace mla_decode
