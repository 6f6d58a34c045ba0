// What the plan needs to know about each split kernel's resources. The
// mma.sync kernel's layouts are plain constexpr (kernels/sm80/mma_sync_layout.h)
// and included directly; the Hopper kernels' layouts live in their CUDA
// headers, so their totals are restated here and each launcher checks its
// kernel's layout against them with a static_assert (a layout change that
// forgets this table does not compile).
#pragma once

#include "kernels/common/geometry.h"
#include "kernels/sm80/mma_sync_layout.h"

namespace mla_decode {
namespace plan {

constexpr int kWideSmemBytes = 230912;             // sm90::wide::Smem::kTotal
constexpr int kNarrowSmemBytes = 168864;           // sm90::narrow::Smem::kTotal
constexpr int kNarrowRegisterVSmemBytes = 189560;  // sm90::narrow_fp8::Smem::kTotal

// Cache row bytes of each format.
constexpr int64_t row_bytes(KvFormat f) {
  return f == KvFormat::kBf16 ? 2 * kHeadDimQK : f == KvFormat::kMxfp4 ? kMxfp4RowBytes : kHeadDimQK;
}

}  // namespace plan
}  // namespace mla_decode
