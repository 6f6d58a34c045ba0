// Stand-in for csrc/kernels/common/launch_contract.h in the host emulation of
// locate_work (locate_work_emu.cpp): the launch arguments the work
// assignment reads, without the CUDA launch helpers. Its include path comes
// before csrc's, so csrc/kernels/common/work.cuh includes this one.
#pragma once

#include <cstdint>

#include "common/params.h"
#include "kernels/common/geometry.h"

namespace mla_decode {
namespace cuda {

struct DecodeLaunch {  // the fields of the real DecodeLaunch that work.cuh reads
  MlaDecodeParams p;
  int32_t num_splits;
  int32_t head_groups;
  int32_t q_per_item;
};

}  // namespace cuda
}  // namespace mla_decode
