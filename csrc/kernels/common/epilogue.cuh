// The split kernels' LSE epilogue: a head's natural-log LSE from its
// online-softmax state, stored where the split contract (launch_contract.h)
// puts it. Portable (CUDA and HIP).
#pragma once

#include "common/params.h"
#include "common/portability.h"
#include "kernels/common/launch_contract.h"
#include "kernels/common/work.cuh"

namespace mla_decode {
namespace cuda {

// Head h's natural-log LSE from its reference maximum m (log2 domain) and row
// sum l (-inf for an empty split; NaN for a NaN sum or an orphan token), stored
// as the split contract says: into lse with one split, else into this split's
// partial_lse row. `rows` = total_q * H. (The mma.sync and MFMA kernels
// compute the same value inline, fused with their output rows' NaN rule.)
__device__ __forceinline__ void store_head_lse(const DecodeLaunch& args, const WorkItem& work, int h, int64_t rows,
                                               float m, float l) {
  const MlaDecodeParams& p = args.p;
  float lse = l > 0.f ? (m + __log2f(l)) * 0.6931471805599453f : -MLA_INF;
  if (isnan(l) || work.orphan) lse = MLA_NAN;
  if (args.num_splits == 1) {
    p.lse[static_cast<int64_t>(work.t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] = lse;
  } else {
    const int64_t out_row = static_cast<int64_t>(work.t) * p.num_heads + h;
    args.partial_lse[static_cast<int64_t>(work.split) * rows + out_row] = lse;
  }
}

}  // namespace cuda
}  // namespace mla_decode
