// What the CPU tools (piece_bench.cpp, scalar_check.cpp) share to make their
// synthetic inputs: bf16 rounding, the nearest OCP e4m3 code of a value, and
// the cache fields of a dense indptr layout. Not part of the extension.
#pragma once

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>

#include "common/params.h"

namespace mla_decode {
namespace tools {

// f rounded to bf16 (nearest, ties to even; finite inputs).
inline uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The nearest finite e4m3fn code of f (the smaller magnitude on a tie, the
// largest finite magnitude, 448, beyond it).
class E4m3Quantiser {
 public:
  E4m3Quantiser() {
    for (int c = 0; c < 127; ++c) {  // codes 0..126: the finite non-negative magnitudes, increasing
      const int e = c >> 3, m = c & 7;
      mags_[c] = e == 0 ? m / 512.f : std::ldexp(1.f + m / 8.f, e - 7);
    }
  }
  uint8_t code(float f) const {
    const float a = std::fabs(f);
    int c = static_cast<int>(std::lower_bound(mags_, mags_ + 127, a) - mags_);
    if (c == 127) c = 126;
    else if (c > 0 && a - mags_[c - 1] <= mags_[c] - a) --c;
    return static_cast<uint8_t>(c | (f < 0 ? 0x80 : 0));
  }

 private:
  float mags_[127];
};

// The cache of p: dense rows of `row_bytes` (the format's own size), MXFP4
// scale rows of 18 bytes, items by kv_indptr.
inline void set_dense_cache(MlaDecodeParams& p, KvFormat format, const void* kv, int row_bytes,
                            const float* fp8_scale, const uint8_t* mx_scale, const int32_t* kv_indptr) {
  p.format = format;
  p.kv = kv;
  p.kv_row_stride_bytes = row_bytes;
  p.fp8_scale = fp8_scale;
  p.mx_scale = mx_scale;
  p.mx_scale_stride_row = kMxBlocksPerRow;
  p.mx_scale_stride_col = 1;
  p.layout = KvLayout::kIndptr;
  p.kv_indptr = kv_indptr;
}

}  // namespace tools
}  // namespace mla_decode
