// The CPU kernel's driver: path choice, work split, threads, split merge and
// output. The per-piece arithmetic is in kernel_*.cpp (kernel_common.h has
// the contract).
//
// Work split. The rows of item b are its query tokens x heads, cut into
// groups of up to 16 heads of one token. Consecutive groups of one item (at
// most 8, i.e. 128 rows) form a set; a path decodes each tile of keys once for
// the whole set. A set's keys (those its last token sees) are cut into
// pieces of equal length, a multiple of 64 keys, so that the call has about
// kTargetPieces pieces of equal work (an item with a long cache is spread
// over every core), but no piece is shorter than kMinPieceKeys (256, in every
// format: the kernel is bound by its products, and a 256-key piece's products
// cost some 30 times its partial's writing and merging). The split follows
// from the shapes alone, never from the thread count, so results do not
// depend on it. Pieces run under one at::parallel_for; the thread that
// completes a split set's last piece (a counter per set) merges the set's
// pieces by log-sum-exp, in piece order, so the result does not depend on
// which thread that is, and a call has one parallel region.
#include "decode_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/addressing.h"
#include "cpu/cpu_features.h"
#include "cpu/kernel_common.h"

// at::parallel_for of an OpenMP build of ATen is an inline `#pragma omp
// parallel`: compiled without -fopenmp it runs every piece on the calling
// thread. explain() says so (parallel=serial-build).
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#define MLA_CPU_SERIAL_BUILD 1
#pragma message("mla_decode: csrc/cpu is compiled without -fopenmp, so at::parallel_for runs on one thread")
#else
#define MLA_CPU_SERIAL_BUILD 0
#endif

namespace mla_decode {
namespace {

using cpu::GroupDesc;
using cpu::kGroupRows;
using cpu::kMaxGroupsPerPiece;
using cpu::kOFloats;
using cpu::kPieceKeyAlign;

constexpr int64_t kTargetPieces = 32;
constexpr int64_t kMinPieceKeys = 256;  // a multiple of kPieceKeyAlign
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Floats of one group's record: O (16 x 512), then m (16) and l (16) of the
// piece's groups follow all the O blocks (PieceArgs layout).
constexpr int64_t kRecordFloats = kOFloats + 2 * kGroupRows;

// 64-byte aligned float storage that keeps its memory between calls.
class AlignedFloats {
 public:
  float* get(int64_t n) {
    if (n > cap_) {
      std::free(data_);
      cap_ = std::max<int64_t>(n, cap_ * 3 / 2);
      data_ = static_cast<float*>(std::aligned_alloc(64, ((cap_ * 4 + 63) / 64) * 64));
      TORCH_CHECK(data_ != nullptr, "mla_decode: the CPU kernel could not allocate ", cap_ * 4, " bytes of scratch.");
    }
    return data_;
  }
  ~AlignedFloats() { std::free(data_); }

 private:
  float* data_ = nullptr;
  int64_t cap_ = 0;
};

struct Set {
  int32_t b, g_begin, ng;
  int32_t keys;          // keys its last (latest) token sees
  int32_t piece_keys;    // keys per piece
  int32_t pieces;        // >= 1
  int64_t first_piece;
  int64_t record_offset;  // floats into the partial buffer (pieces > 1)
};

struct Plan {
  std::vector<GroupDesc> groups;
  std::vector<Set> sets;
  std::vector<int32_t> piece_set;  // set of each piece
  int64_t partial_floats = 0;
  int32_t max_pieces_per_set = 1;
};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

Plan make_plan(const MlaDecodeParams& p) {
  Plan plan;
  const int32_t head_groups = (p.num_heads + kGroupRows - 1) / kGroupRows;
  int64_t total_work = 0;  // keys x groups, summed over sets
  for (int32_t b = 0; b < p.batch; ++b) {
    const int32_t q_begin = p.qo_indptr[b], q_len = p.qo_indptr[b + 1] - q_begin;
    const int32_t kv_len = kv_length(p, b);
    const int32_t g_first = static_cast<int32_t>(plan.groups.size());
    for (int32_t t = 0; t < q_len; ++t) {
      for (int32_t hg = 0; hg < head_groups; ++hg) {
        const int32_t h0 = hg * kGroupRows;
        plan.groups.push_back(GroupDesc{q_begin + t, h0, std::min(kGroupRows, p.num_heads - h0),
                                        visible_keys(kv_len, q_len, t)});
      }
    }
    const int32_t g_end = static_cast<int32_t>(plan.groups.size());
    for (int32_t g = g_first; g < g_end; g += kMaxGroupsPerPiece) {
      Set s{};
      s.b = b;
      s.g_begin = g;
      s.ng = std::min(kMaxGroupsPerPiece, g_end - g);
      s.keys = plan.groups[g + s.ng - 1].visible;  // visible grows with the token
      plan.sets.push_back(s);
      total_work += static_cast<int64_t>(s.keys) * s.ng;
    }
  }
  int64_t piece_index = 0;
  for (Set& s : plan.sets) {
    const int64_t even_share = (total_work + kTargetPieces - 1) / kTargetPieces / s.ng;
    const int64_t want = round_up(std::max<int64_t>(kMinPieceKeys, even_share), kPieceKeyAlign);
    s.pieces = static_cast<int32_t>(std::max<int64_t>(1, (s.keys + want - 1) / want));
    // Equal pieces (a multiple of kPieceKeyAlign keys; the last may be shorter).
    s.piece_keys = static_cast<int32_t>(round_up((s.keys + s.pieces - 1) / s.pieces, kPieceKeyAlign));
    if (s.keys == 0) s.piece_keys = 0;
    s.pieces = s.piece_keys > 0 ? static_cast<int32_t>((s.keys + s.piece_keys - 1) / s.piece_keys) : 1;
    s.first_piece = piece_index;
    piece_index += s.pieces;
    if (s.pieces > 1) {
      s.record_offset = plan.partial_floats;
      plan.partial_floats += static_cast<int64_t>(s.pieces) * s.ng * kRecordFloats;
    }
    plan.max_pieces_per_set = std::max(plan.max_pieces_per_set, s.pieces);
  }
  plan.piece_set.resize(piece_index);
  for (int32_t si = 0; si < static_cast<int32_t>(plan.sets.size()); ++si) {
    const Set& s = plan.sets[si];
    for (int32_t c = 0; c < s.pieces; ++c) plan.piece_set[s.first_piece + c] = si;
  }
  return plan;
}

using PieceFn = void (*)(const cpu::PieceArgs&, const cpu::CallScales&);

PieceFn piece_fn(CpuPath path) {
  switch (path) {
    case CpuPath::kAvx2: return &cpu::piece_avx2;
    case CpuPath::kAvx512: return &cpu::piece_avx512;
    case CpuPath::kAvx512Fp32: return &cpu::piece_avx512_fp32;
    case CpuPath::kAmx: return &cpu::piece_amx;
    default: return &cpu::piece_scalar;
  }
}

// The vector paths work on the stored codes and fold the fp8 tensor scale
// into the logit scale and the output; the scalar path decodes code * scale.
cpu::CallScales call_scales(const MlaDecodeParams& p, CpuPath path) {
  const bool fp8 = p.format == KvFormat::kFp8E4M3FN || p.format == KvFormat::kFp8E4M3FNUZ;
  if (fp8 && path != CpuPath::kScalar) return {p.sm_scale * *p.fp8_scale, *p.fp8_scale};
  return {p.sm_scale, 1.f};
}

// o[d] += w * x[d], d < kHeadDimV: the merge's inner loop, compiled once per
// vector ISA level and chosen when the library loads (the driver itself is
// built for baseline x86-64).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLA_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLA_ISA_CLONES
#endif
MLA_ISA_CLONES void add_scaled_row(float* o, const float* x, float w) {
  for (int d = 0; d < kHeadDimV; ++d) o[d] += w * x[d];
}

// fp32 to bf16 bits, rounding to nearest even, NaN to 0x7FC0 (c10::BFloat16's
// rule), branch-free so that the compiler vectorises the output loop.
inline uint16_t bf16_bits_rne(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

// o[d] = bf16(f * a[d]), d < kHeadDimV: the output rounding, cloned per ISA
// level like add_scaled_row.
MLA_ISA_CLONES void store_row_bf16(uint16_t* o, const float* a, float f) {
  for (int d = 0; d < kHeadDimV; ++d) o[d] = bf16_bits_rne(a[d] * f);
}

// out = o_scale * O / l (bf16), lse = m + log(l); a row that sees no key gets 0 and -inf.
void store_group(const MlaDecodeParams& p, const GroupDesc& gd, const float* O, const float* m, const float* l,
                 float o_scale) {
  uint16_t* obase = static_cast<uint16_t*>(p.out);
  for (int h = 0; h < gd.nh; ++h) {
    uint16_t* o = obase + static_cast<int64_t>(gd.q_row) * p.out_stride_token +
                  static_cast<int64_t>(gd.h0 + h) * p.out_stride_head;
    float* lse = p.lse + static_cast<int64_t>(gd.q_row) * p.lse_stride_token +
                 static_cast<int64_t>(gd.h0 + h) * p.lse_stride_head;
    if (gd.visible == 0) {
      for (int d = 0; d < kHeadDimV; ++d) o[d] = 0;
      *lse = kNegInf;
      continue;
    }
    const float f = o_scale / l[h];
    const float* a = O + h * cpu::kORow;
    store_row_bf16(o, a, f);
    *lse = m[h] + std::log(l[h]);
  }
}

// Runs `plan` on `path`; `serial` keeps every piece on the calling thread.
void run_plan(const MlaDecodeParams& p, const Plan& plan, CpuPath path, bool serial) {
  const PieceFn fn = piece_fn(path);
  const cpu::CallScales scales = call_scales(p, path);
  static thread_local AlignedFloats partial_storage;  // the calling thread's, reused across calls
  float* partial = plan.partial_floats > 0 ? partial_storage.get(plan.partial_floats) : nullptr;
  // Pieces completed per set (split sets only), the calling thread's, reused.
  static thread_local std::unique_ptr<std::atomic<int32_t>[]> done_storage;
  static thread_local size_t done_capacity = 0;
  const size_t n_sets = plan.sets.size();
  if (plan.partial_floats > 0 && done_capacity < n_sets) {
    done_storage.reset(new std::atomic<int32_t>[n_sets]);
    done_capacity = n_sets;
  }
  std::atomic<int32_t>* const done = done_storage.get();
  if (plan.partial_floats > 0) {
    for (size_t si = 0; si < n_sets; ++si) done[si].store(0, std::memory_order_relaxed);
  }

  // Merge group g of split set s: M = max m_c, l = sum l_c e^(m_c - M),
  // O = sum O_c e^(m_c - M) over its pieces c in order (an empty piece has
  // m = -inf and weighs 0).
  auto merge_group = [&](const Set& s, int32_t g) {
    static thread_local AlignedFloats merged;
    float* O = merged.get(kOFloats);
    const int64_t piece_floats = static_cast<int64_t>(s.ng) * kRecordFloats;
    const GroupDesc& gd = plan.groups[s.g_begin + g];
    float m[kGroupRows], l[kGroupRows];
    for (int h = 0; h < gd.nh; ++h) {
      float mx = kNegInf;
      for (int32_t c = 0; c < s.pieces; ++c) {
        const float* mc = partial + s.record_offset + c * piece_floats + s.ng * kOFloats;
        mx = std::max(mx, mc[g * kGroupRows + h]);
      }
      float lsum = 0.f;
      float* o = O + h * cpu::kORow;
      std::fill(o, o + kHeadDimV, 0.f);
      for (int32_t c = 0; c < s.pieces; ++c) {
        const float* base = partial + s.record_offset + c * piece_floats;
        const float m_c = base[s.ng * kOFloats + g * kGroupRows + h];
        const float l_c = base[s.ng * kOFloats + s.ng * kGroupRows + g * kGroupRows + h];
        if (m_c == kNegInf && !std::isnan(l_c)) continue;  // the piece saw no key of this row
        const float w = std::exp(m_c - mx);
        lsum += l_c * w;
        const float* oc = base + static_cast<int64_t>(g) * kOFloats + h * cpu::kORow;
        add_scaled_row(o, oc, w);
      }
      m[h] = mx;
      l[h] = lsum;
    }
    store_group(p, gd, O, m, l, scales.o_scale);
  };

  auto run_pieces = [&](int64_t begin, int64_t end) {
    static thread_local AlignedFloats own;  // a whole set's state: ng x (O, m, l)
    for (int64_t pc = begin; pc < end; ++pc) {
      const int32_t si = plan.piece_set[pc];
      const Set& s = plan.sets[si];
      const int32_t c = static_cast<int32_t>(pc - s.first_piece);
      float* rec = s.pieces > 1 ? partial + s.record_offset + static_cast<int64_t>(c) * s.ng * kRecordFloats
                                : own.get(kMaxGroupsPerPiece * kRecordFloats);
      cpu::PieceArgs a{};
      a.p = &p;
      a.b = s.b;
      a.groups = plan.groups.data() + s.g_begin;
      a.ng = s.ng;
      a.key_begin = std::min(s.keys, c * s.piece_keys);
      a.key_end = std::min(s.keys, a.key_begin + s.piece_keys);
      a.O = rec;
      a.m = rec + static_cast<int64_t>(s.ng) * kOFloats;
      a.l = a.m + s.ng * kGroupRows;
      fn(a, scales);
      if (s.pieces == 1) {
        for (int g = 0; g < s.ng; ++g) {
          store_group(p, a.groups[g], a.O + static_cast<int64_t>(g) * kOFloats, a.m + g * kGroupRows,
                      a.l + g * kGroupRows, scales.o_scale);
        }
      } else if (done[si].fetch_add(1, std::memory_order_acq_rel) == s.pieces - 1) {
        // The set's last piece: the acquire sees every other piece's record.
        for (int32_t g = 0; g < s.ng; ++g) merge_group(s, g);
      }
    }
  };
  const int64_t n_pieces = static_cast<int64_t>(plan.piece_set.size());
  if (serial) {
    run_pieces(0, n_pieces);
  } else {
    at::parallel_for(0, n_pieces, 1, run_pieces);
  }
}

// ---- the AMX self-test ------------------------------------------------------
//
// The first time AMX would run in a process, a small fixed problem (H = 20:
// two groups, one partial; 2 query tokens; 150 and 37 keys; bf16, fp8 and
// MXFP4) runs through the AMX and the AVX-512 paths on the calling thread and
// the two results are compared with the tests' tolerances (relative Frobenius
// 8e-3, LSE 2e-3). A fault in the tile code (SIGILL, SIGSEGV) during the test
// is caught and counts as a failure. On failure AMX stays off for the
// process, with one warning.

thread_local sigjmp_buf* t_fault_jump = nullptr;
struct sigaction g_old_sigill, g_old_sigsegv;

void on_fault(int sig) {
  if (t_fault_jump != nullptr) siglongjmp(*t_fault_jump, sig);
  // Not the self-test's thread: put the previous handler back and return, so
  // the faulting instruction runs again under it.
  sigaction(sig, sig == SIGILL ? &g_old_sigill : &g_old_sigsegv, nullptr);
}

struct SelfTestCase {
  std::vector<uint16_t> q;
  std::vector<uint8_t> kv;
  std::vector<uint8_t> mx_scale;
  std::vector<int32_t> qo_indptr{0, 2, 4}, kv_indptr{0, 150, 187};
  float fp8_scale = 0.0137f;
  std::vector<uint16_t> out[2];
  std::vector<float> lse[2];
};

uint32_t lcg(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}

uint16_t bf16_of(float f) { return c10::BFloat16(f).x; }

MlaDecodeParams self_test_params(SelfTestCase& c, KvFormat format) {
  constexpr int kHeads = 20, kRows = 4, kKeys = 187;
  uint32_t st = 12345u + static_cast<uint32_t>(format);
  c.q.resize(kRows * kHeads * kHeadDimQK);
  for (auto& v : c.q) v = bf16_of((static_cast<float>(lcg(st) % 2001) - 1000.f) / 400.f);
  int64_t row_bytes = format == KvFormat::kBf16 ? 2 * kHeadDimQK
                      : format == KvFormat::kMxfp4 ? kMxfp4RowBytes : kHeadDimQK;
  c.kv.resize(kKeys * row_bytes);
  if (format == KvFormat::kBf16) {
    for (int64_t i = 0; i < kKeys * kHeadDimQK; ++i) {
      const uint16_t v = bf16_of((static_cast<float>(lcg(st) % 2001) - 1000.f) / 500.f);
      std::memcpy(c.kv.data() + 2 * i, &v, 2);
    }
  } else if (format == KvFormat::kMxfp4) {
    for (auto& v : c.kv) v = static_cast<uint8_t>(lcg(st));
    c.mx_scale.resize(kKeys * kMxBlocksPerRow);
    for (auto& v : c.mx_scale) v = static_cast<uint8_t>(122 + lcg(st) % 8);
  } else {
    for (auto& v : c.kv) {
      uint8_t code = static_cast<uint8_t>(lcg(st));
      if ((code & 0x7F) >= 0x70) code &= 0xBF;  // no NaN codes, no huge values
      v = code;
    }
  }
  for (int k = 0; k < 2; ++k) {
    c.out[k].assign(kRows * kHeads * kHeadDimV, 0);
    c.lse[k].assign(kRows * kHeads, 0.f);
  }
  MlaDecodeParams p;
  p.batch = 2;
  p.num_heads = kHeads;
  p.total_q = kRows;
  p.num_cache_rows = kKeys;
  p.sm_scale = 1.f / 24.f;
  p.q = c.q.data();
  p.q_stride_token = kHeads * kHeadDimQK;
  p.q_stride_head = kHeadDimQK;
  p.format = format;
  p.kv = c.kv.data();
  p.kv_row_stride_bytes = row_bytes;
  p.fp8_scale = &c.fp8_scale;
  p.mx_scale = c.mx_scale.data();
  p.mx_scale_stride_row = kMxBlocksPerRow;
  p.mx_scale_stride_col = 1;
  p.layout = KvLayout::kIndptr;
  p.qo_indptr = c.qo_indptr.data();
  p.kv_indptr = c.kv_indptr.data();
  p.out_stride_token = kHeads * kHeadDimV;
  p.out_stride_head = kHeadDimV;
  p.lse_stride_token = kHeads;
  p.lse_stride_head = 1;
  return p;
}

// nullptr when AMX agrees with AVX-512 on every format, else what went wrong.
const char* amx_self_test(std::string* detail) {
  for (KvFormat format : {KvFormat::kBf16, KvFormat::kFp8E4M3FN, KvFormat::kMxfp4}) {
    SelfTestCase c;
    MlaDecodeParams p = self_test_params(c, format);
    const Plan plan = make_plan(p);
    for (int k = 0; k < 2; ++k) {
      p.out = c.out[k].data();
      p.lse = c.lse[k].data();
      if (k == 0) {
        run_plan(p, plan, CpuPath::kAvx512, /*serial=*/true);
        continue;
      }
      sigjmp_buf jump;
      struct sigaction sa;
      std::memset(&sa, 0, sizeof(sa));
      sa.sa_handler = on_fault;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGILL, &sa, &g_old_sigill);
      sigaction(SIGSEGV, &sa, &g_old_sigsegv);
      const int sig = sigsetjmp(jump, 1);
      if (sig == 0) {
        t_fault_jump = &jump;
        run_plan(p, plan, CpuPath::kAmx, /*serial=*/true);
      }
      t_fault_jump = nullptr;
      sigaction(SIGILL, &g_old_sigill, nullptr);
      sigaction(SIGSEGV, &g_old_sigsegv, nullptr);
      if (sig != 0) {
        *detail = sig == SIGILL ? "SIGILL" : "SIGSEGV";
        return "a tile instruction faulted during the self-test";
      }
    }
    double num = 0, den = 0, lse_err = 0;
    for (size_t i = 0; i < c.out[0].size(); ++i) {
      const double a = c10::BFloat16(c.out[1][i], c10::BFloat16::from_bits()), b = c10::BFloat16(c.out[0][i],
                                                                                       c10::BFloat16::from_bits());
      num += (a - b) * (a - b);
      den += b * b;
    }
    for (size_t i = 0; i < c.lse[0].size(); ++i) {
      lse_err = std::max(lse_err, std::abs(static_cast<double>(c.lse[1][i]) - c.lse[0][i]));
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    if (!(rel < 8e-3) || !(lse_err < 2e-3)) {  // also catches NaN
      *detail = std::string(format == KvFormat::kBf16 ? "bf16" : format == KvFormat::kMxfp4 ? "mxfp4" : "fp8") +
                ": relative error " + std::to_string(rel) + ", LSE error " + std::to_string(lse_err);
      return "AMX and AVX-512 disagree on the self-test";
    }
  }
  return nullptr;
}

// nullptr when AMX may run in this process, else why not.
const char* amx_state() {
  static const char* reason = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    if (!cpu::vector_paths_built()) {
      reason = "this build has no x86-64 vector paths";
      return;
    }
#ifdef MLA_CPU_AMX_EMULATION
    if (!cpu::cpu_features().avx512_bf16) {
      reason = "the AMX emulation build needs AVX-512 BF16";
      return;
    }
#else
    if (!cpu::cpu_features().amx_bf16) {
      reason = "the CPU lacks AMX-BF16 (or the OS does not enable the tile state)";
      return;
    }
    reason = cpu::amx_permission();
    if (reason != nullptr) {
      TORCH_WARN_ONCE("mla_decode: AMX is off for this process: ", reason, "; the CPU kernel uses AVX-512.");
      return;
    }
#endif
    std::string detail;
    reason = amx_self_test(&detail);
    if (reason != nullptr) {
      TORCH_WARN_ONCE("mla_decode: AMX is off for this process: ", reason, " (", detail,
                      "); the CPU kernel uses AVX-512.");
    }
  });
  return reason;
}

const char* why_auto(CpuPath chosen) {
  switch (chosen) {
#ifdef MLA_CPU_AMX_EMULATION
    case CpuPath::kAmx: return "auto: AMX-BF16 tiles for QK and PV, EMULATED in scalar code (a test build)";
#else
    case CpuPath::kAmx: return "auto: AMX-BF16 tiles for QK and PV (self-test passed)";
#endif
    case CpuPath::kAvx512:
      return cpu::cpu_features().amx_bf16 ? "auto: AVX-512 BF16 (AMX is off for this process)"
                                          : "auto: AVX-512 BF16 dot products (the CPU lacks AMX-BF16)";
    case CpuPath::kAvx512Fp32:
      if (cpu::cpu_features().amx_bf16) {
        return "auto: AVX-512 fp32 FMA (AMX is off for this process; on Intel cores vdpbf16ps is slower than two FMAs)";
      }
      return cpu::cpu_features().avx512_bf16 ? "auto: AVX-512 fp32 FMA (on Intel cores vdpbf16ps is slower than two FMAs)"
                                             : "auto: AVX-512 fp32 FMA (the CPU lacks AVX-512 BF16)";
    case CpuPath::kAvx2: return "auto: AVX2 + FMA in fp32 (the CPU lacks AVX-512 BF16)";
    default: return "auto: the portable C++ kernel (the CPU has no AVX2 + FMA, or this is not an x86-64 build)";
  }
}

}  // namespace

const char* cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::kAuto: return "auto";
    case CpuPath::kScalar: return "scalar";
    case CpuPath::kAvx2: return "avx2";
    case CpuPath::kAvx512: return "avx512";
    case CpuPath::kAmx: return "amx";
    case CpuPath::kAvx512Fp32: return "avx512_fp32";
  }
  return "unknown";
}

bool cpu_path_from_name(const char* name, CpuPath* path) {
  for (CpuPath c : {CpuPath::kAuto, CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAmx,
                    CpuPath::kAvx512Fp32}) {
    if (std::strcmp(name, cpu_path_name(c)) == 0) {
      *path = c;
      return true;
    }
  }
  return false;
}

const char* cpu_path_unavailable(CpuPath path) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const bool built = cpu::vector_paths_built();
  switch (path) {
    case CpuPath::kAuto:
    case CpuPath::kScalar: return nullptr;
    case CpuPath::kAvx2:
      if (!built) return "this build has no x86-64 vector paths";
      return f.avx2_fma ? nullptr : "the CPU lacks AVX2 + FMA + F16C + BMI2 (or the OS does not enable the ymm state)";
    case CpuPath::kAvx512:
      if (!built) return "this build has no x86-64 vector paths";
      if (f.avx512_bf16) return nullptr;
      return f.avx512_f ? "the CPU lacks AVX-512 BF16"
                        : "the CPU lacks AVX-512 F/BW/VL/DQ (or the OS does not enable the zmm state)";
    case CpuPath::kAvx512Fp32:
      if (!built) return "this build has no x86-64 vector paths";
      return f.avx512_f ? nullptr : "the CPU lacks AVX-512 F/BW/VL/DQ (or the OS does not enable the zmm state)";
    case CpuPath::kAmx: return amx_state();
  }
  return "unknown CPU path";
}

CpuPath cpu_auto_path() {
  if (cpu_path_unavailable(CpuPath::kAvx512) == nullptr && amx_state() == nullptr) return CpuPath::kAmx;
  if (cpu_path_unavailable(CpuPath::kAvx512) == nullptr && !cpu::cpu_features().intel) return CpuPath::kAvx512;
  if (cpu_path_unavailable(CpuPath::kAvx512Fp32) == nullptr) return CpuPath::kAvx512Fp32;
  if (cpu_path_unavailable(CpuPath::kAvx2) == nullptr) return CpuPath::kAvx2;
  return CpuPath::kScalar;
}

std::string describe_cpu_plan(const MlaDecodeParams& p, const CpuOptions& opt) {
  const CpuPath path = opt.path == CpuPath::kAuto ? cpu_auto_path() : opt.path;
  const Plan plan = make_plan(p);
  std::string s = std::string("kernel=cpu_") + cpu_path_name(path) +
                  ";splits=" + std::to_string(plan.max_pieces_per_set) +
                  ";pieces=" + std::to_string(plan.piece_set.size()) +
                  ";threads=" + std::to_string(MLA_CPU_SERIAL_BUILD ? 1 : at::get_num_threads()) +
                  ";parallel=" + (MLA_CPU_SERIAL_BUILD ? "serial-build" : "at-parallel-for") + ";why=" +
                  (opt.path == CpuPath::kAuto ? why_auto(path) : "forced by the override cpu_path");
  if (opt.path != CpuPath::kAuto) {
    const char* no = cpu_path_unavailable(opt.path);
    if (no != nullptr) s += std::string(";error=") + no;
  }
  return s;
}

void decode_cpu(const MlaDecodeParams& p, const CpuOptions& opt) {
  const char* unavailable = cpu_path_unavailable(opt.path);
  TORCH_CHECK(unavailable == nullptr, "mla_decode: the CPU path '", cpu_path_name(opt.path),
              "' cannot run on this CPU: ", unavailable ? unavailable : "", ".");
  const CpuPath path = opt.path == CpuPath::kAuto ? cpu_auto_path() : opt.path;
  const Plan plan = make_plan(p);
  run_plan(p, plan, path, /*serial=*/false);
}

}  // namespace mla_decode
