// The contract between the CPU kernel's driver (decode_cpu.cpp: work split,
// threads, split merge, output) and its paths (one function per path that
// computes one piece of work).
//
// A group is up to 16 heads of one query token: its rows share one visible
// key count. A piece is a run of keys [key_begin, key_end) of one item seen
// by a set of consecutive groups of that item; a path decodes each tile of
// those keys once and runs every group of the set on it. For each group a
// piece leaves the unnormalised softmax state of its 16 rows:
//     m[r]        running max of the logits (natural-log units)
//     l[r]        sum_j exp(s_j - m[r])
//     O[r][0:512] sum_j exp(s_j - m[r]) * V_j / o_scale   (rows kORow floats apart)
// where `o_scale` (PieceArgs) is the factor the driver applies to O when it
// normalises (the fp8 tensor scale for the vector paths, which work on the
// unscaled codes; 1 for the scalar path). A group that sees no key of the
// piece gets m = -inf, l = 0, O = 0. Rows beyond a group's nh hold values
// that the driver ignores.
#pragma once

#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <new>

#include "common/params.h"

namespace mla_decode {
namespace cpu {

constexpr int kGroupRows = 16;          // heads per group (one AMX tile of rows)
constexpr int kMaxGroupsPerPiece = 8;   // 128 rows: all heads of one token at H = 128
constexpr int kPieceKeyAlign = 64;      // piece boundaries are multiples of this (every path's tile)
// Floats between rows of O: 512 plus one cache line, because rows 2048 bytes
// apart map to the same two L1 sets and a 16-row tile of them thrashes.
constexpr int kORow = kHeadDimV + 16;
constexpr int kOFloats = kGroupRows * kORow;  // one group's accumulator

struct GroupDesc {
  int32_t q_row;    // row of q / out (qo_indptr[b] + token)
  int32_t h0, nh;   // heads h0 .. h0 + nh - 1 (nh <= 16)
  int32_t visible;  // keys of the item this token sees (bottom-right causal)
};

struct PieceArgs {
  const MlaDecodeParams* p;
  int32_t b;                 // batch item
  const GroupDesc* groups;   // ng groups, 1 <= ng <= kMaxGroupsPerPiece, visible non-decreasing
  int32_t ng;
  int32_t key_begin, key_end;  // keys of this piece (each group stops at its own visible count)
  float* O;                  // ng x 16 x kORow, 64-byte aligned
  float* m;                  // ng x 16
  float* l;                  // ng x 16
};

// Scale factors of a call, set by the driver from the format.
struct CallScales {
  float qk;       // logit = qk * dot(q, stored values)   (vector paths: sm_scale * fp8 scale)
  float o_scale;  // out = o_scale * O / l
};

// The paths. Each runs on the calling thread and must only be called where
// cpu_features() (and, for AMX, amx_permission()) allow it.
void piece_scalar(const PieceArgs& a, const CallScales& s);
void piece_avx2(const PieceArgs& a, const CallScales& s);
void piece_avx512(const PieceArgs& a, const CallScales& s);
void piece_avx512_fp32(const PieceArgs& a, const CallScales& s);
void piece_amx(const PieceArgs& a, const CallScales& s);

// Whether the vector paths were compiled into this build (x86-64, GCC or clang).
bool vector_paths_built();

// A path's per-thread scratch: one 64-byte aligned T per thread, allocated on
// the thread's first piece and kept until the thread ends.
template <class T>
T& thread_scratch() {
  struct Free {
    void operator()(T* p) const { free(p); }
  };
  static thread_local std::unique_ptr<T, Free> scratch;
  if (!scratch) {
    scratch.reset(static_cast<T*>(aligned_alloc(64, (sizeof(T) + 63) / 64 * 64)));
    if (!scratch) throw std::bad_alloc();
  }
  return *scratch;
}

// The vector paths' softmax runs in log2 units: scores times log2(e), exp2, and
// the maxima back to natural log for the merge. A row's reference maximum is
// kept until a score exceeds it by more than kLazyRescale (log2 units), so O is
// rescaled rarely (probabilities stay below 2^kLazyRescale).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLazyRescale = 8.f;

// The vector paths' running state of a piece before its first key: each row's
// reference maximum m2 (log2 units, the path's ng x 16 array) -inf, its sum 0.
// O is not cleared: the PV of a group's first tile (the one at key_begin)
// starts from zero accumulators and writes it, and that tile's softmax step
// leaves O alone.
inline void begin_piece_state(const PieceArgs& a, float* m2) {
  std::fill(m2, m2 + a.ng * kGroupRows, -std::numeric_limits<float>::infinity());
  std::fill(a.l, a.l + a.ng * kGroupRows, 0.f);
}

// ... and after its last key: the natural-log maxima the merge reads (-inf
// stays -inf), and O = 0 for the groups that saw no key of the piece.
inline void end_piece_state(const PieceArgs& a, const float* m2) {
  for (int i = 0; i < a.ng * kGroupRows; ++i) a.m[i] = m2[i] * kLn2;
  for (int g = 0; g < a.ng; ++g) {
    if (std::min(a.key_end, a.groups[g].visible) > a.key_begin) continue;
    std::fill(a.O + static_cast<int64_t>(g) * kOFloats, a.O + static_cast<int64_t>(g + 1) * kOFloats, 0.f);
  }
}

}  // namespace cpu
}  // namespace mla_decode
