// Runs the hipified HIP kernels of mla_decode (csrc/kernels/cdna: the gfx942
// body of mfma_kernel.cuh, or with -D__gfx950__ the gfx950 body of
// mfma_gfx950.cuh; the combine kernel of kernels/common; through the plan and
// launch_decode) on the host under hip/hip_runtime.h of this directory, and
// compares every output row with a float64 reference. Built and run by
// scripts/hip_check.sh, once per arch. First it checks the emulated
// instructions against scalar references and the kernels' register helpers
// exhaustively; then 36 decode problems (every format, H 16 to 128, q_len 1
// to 4, ragged lengths with empty items, all three layouts, 1 to 40 splits,
// bad indices, NaN block scales, wide block and Q scales). It checks the
// kernel logic (lane layouts, permutations, scales, online softmax,
// split/combine, masking, NaN and empty-row rules, skipped heads), not the
// speed or the hardware.
#include "hip/hip_runtime.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/addressing_hip.h"
#include "common/formats_hip.h"
#include "common/params.h"
#include "kernels/cdna/mfma_kernel_hip.cuh"  // the register dequantisers, tested directly
#include "kernels/common/launch_hip.h"
#include "plan/plan.h"

using namespace mla_decode;

namespace {

constexpr int kNumCus = 16;      // "SM" count handed to the plan for automatic splits
#if defined(__gfx950__)
constexpr int kArch = 950;
#else
constexpr int kArch = 942;
#endif
constexpr int kOutPad = 8;       // bf16 after each out row (sentinel-checked)
constexpr uint16_t kSentinel = 0x1234;
constexpr float kLseSentinel = 12345.f;
constexpr double kRelFroTol = 8e-3;  // tests/cases.py REL_FRO_TOL
constexpr double kLseAbsTol = 2e-3;  // tests/cases.py LSE_ABS_TOL

uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
double bf16_value(uint16_t h) { return bf16_bits_to_float(h); }

struct Case {
  std::string name;
  KvFormat fmt = KvFormat::kBf16;
  KvLayout layout = KvLayout::kIndptr;
  int heads = 16;
  std::vector<int> q_lens, kv_lens;
  int page_size = 1;
  int splits = 1;             // 0: the plan, with kNumCus CUs
  int bad_token = -1;         // this referenced token (flat, item-major) points outside the cache
  bool orphan = false;        // one more query token than qo_indptr covers
  bool nan_scale_token0 = false;  // MXFP4: token 0 of item 0 gets a NaN (0xFF) block scale
  int mx_lo = 124, mx_hi = 129;   // MXFP4: E8M0 block scales drawn from [mx_lo, mx_hi]
  int q_spread = 0;               // each (token, head) of q times 2^(q_shift + k), k uniform in [-q_spread, q_spread / 4]
  int q_shift = 0;
  uint32_t seed = 1;
};

const char* fmt_name(KvFormat f) {
  switch (f) {
    case KvFormat::kBf16: return "bf16";
    case KvFormat::kFp8E4M3FN: return "fp8_e4m3fn";
    case KvFormat::kFp8E4M3FNUZ: return "fp8_e4m3fnuz";
    case KvFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

struct Problem {
  MlaDecodeParams p;
  std::vector<uint16_t> q;
  std::vector<uint8_t> kv;
  std::vector<uint8_t> mx;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, block_table, kv_lens;
  float fp8_scale = 0.5f;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  int64_t row_stride = 0;
};

int row_bytes(KvFormat f) {
  return f == KvFormat::kBf16 ? 2 * kHeadDimQK : f == KvFormat::kMxfp4 ? kMxfp4RowBytes : kHeadDimQK;
}

void fill_row(const Case& cs, Problem& pr, KvFormat f, int64_t r, bool nan_row, std::mt19937& rng) {
  uint8_t* row = pr.kv.data() + r * pr.row_stride;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> u(0, 255);
  if (f == KvFormat::kBf16) {
    for (int d = 0; d < kHeadDimQK; ++d) {
      const uint16_t h = nan_row ? 0x7fc0 : to_bf16(nd(rng));
      memcpy(row + 2 * d, &h, 2);
    }
  } else if (f == KvFormat::kMxfp4) {
    for (int i = 0; i < kMxfp4RowBytes; ++i) row[i] = static_cast<uint8_t>(u(rng));
    for (int k = 0; k < kMxBlocksPerRow; ++k) {
      pr.mx[r * 20 + k] = nan_row ? 0xff : static_cast<uint8_t>(cs.mx_lo + u(rng) % (cs.mx_hi - cs.mx_lo + 1));
    }
  } else {
    const bool fnuz = f == KvFormat::kFp8E4M3FNUZ;
    for (int d = 0; d < kHeadDimQK; ++d) {
      uint8_t c;
      if (nan_row) {
        c = fnuz ? 0x80 : 0x7f;
      } else {
        const int e = u(rng) % (fnuz ? 10 : 9), m = u(rng) % 8, s = u(rng) % 2;
        c = static_cast<uint8_t>((s << 7) | (e << 3) | m);
        if (fnuz && c == 0x80) c = 0;
        // Now and then the bytes whose meaning differs between the flavours
        // (fnuz: +-240; OCP: -0), to reach the kernel's fix-up path.
        if (u(rng) % 97 == 0) c = fnuz ? (u(rng) % 2 ? 0x7f : 0xff) : 0x80;
      }
      row[d] = c;
    }
  }
}

double kv_value(const Problem& pr, KvFormat f, int64_t r, int d) {
  const uint8_t* row = pr.kv.data() + r * pr.row_stride;
  if (f == KvFormat::kBf16) {
    uint16_t h;
    memcpy(&h, row + 2 * d, 2);
    return bf16_value(h);
  }
  if (f == KvFormat::kMxfp4) {
    const uint32_t nib = (row[d / 2] >> (4 * (d % 2))) & 0xf;
    return static_cast<double>(e2m1_to_float(nib)) * e8m0_to_float(pr.mx[r * 20 + d / kMxBlock]);
  }
  const double c = f == KvFormat::kFp8E4M3FNUZ ? e4m3fnuz_to_float(row[d]) : e4m3fn_to_float(row[d]);
  return c * pr.fp8_scale;
}

void build(const Case& c, Problem& pr) {
  std::mt19937 rng(c.seed);
  const int B = static_cast<int>(c.q_lens.size());
  int total_q = 0;
  pr.qo_indptr.assign(1, 0);
  for (int b = 0; b < B; ++b) pr.qo_indptr.push_back(total_q += c.q_lens[b]);
  if (c.orphan) ++total_q;
  int total_kv = 0;
  for (int l : c.kv_lens) total_kv += l;

  MlaDecodeParams& p = pr.p;
  p = MlaDecodeParams{};
  p.batch = B;
  p.num_heads = c.heads;
  p.total_q = total_q;
  p.sm_scale = 1.f / 24.f;
  p.format = c.fmt;
  p.layout = c.layout;
  pr.row_stride = row_bytes(c.fmt) + 16;  // padded rows: the stride is honoured

  // Which cache row each referenced token uses (-1 = deliberately bad).
  std::vector<int64_t> token_row;
  int64_t num_rows = 0;
  if (c.layout == KvLayout::kPaged) {
    const int P = c.page_size;
    int max_pages = 1, pages = 0;
    for (int l : c.kv_lens) {
      max_pages = std::max(max_pages, (l + P - 1) / P);
      pages += (l + P - 1) / P;
    }
    const int num_pages = pages + 3;
    std::vector<int> perm(num_pages);
    for (int i = 0; i < num_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    pr.block_table.assign(static_cast<size_t>(B) * (max_pages + 1), -1);  // one spare column: stride != width
    int next = 0, flat = 0;
    for (int b = 0; b < B; ++b) {
      const int np = (c.kv_lens[b] + P - 1) / P;
      for (int i = 0; i < np; ++i) pr.block_table[b * (max_pages + 1) + i] = perm[next++];
      for (int j = 0; j < c.kv_lens[b]; ++j, ++flat) {
        int32_t& page = pr.block_table[b * (max_pages + 1) + j / P];
        if (flat == c.bad_token) page = num_pages + 2;
        token_row.push_back(page >= num_pages ? -1 : static_cast<int64_t>(page) * P + j % P);
      }
    }
    pr.kv_lens = c.kv_lens;
    num_rows = static_cast<int64_t>(num_pages) * P;
    p.page_size = P;
    p.max_pages_per_seq = max_pages;
    p.block_table_stride = max_pages + 1;
  } else {
    num_rows = total_kv + 5;  // 5 rows no token references: NaN
    pr.kv_indptr.assign(1, 0);
    for (int b = 0; b < B; ++b) pr.kv_indptr.push_back(pr.kv_indptr.back() + c.kv_lens[b]);
    if (c.layout == KvLayout::kIndptrIndices) {
      std::vector<int> perm(num_rows);
      for (int i = 0; i < num_rows; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int i = 0; i < total_kv; ++i) {
        pr.kv_indices.push_back(i == c.bad_token ? static_cast<int32_t>(num_rows + 7) : perm[i]);
        token_row.push_back(i == c.bad_token ? -1 : perm[i]);
      }
      p.num_kv_indices = static_cast<int64_t>(pr.kv_indices.size());
    } else {
      for (int i = 0; i < total_kv; ++i) token_row.push_back(i);
    }
  }
  p.num_cache_rows = num_rows;

  pr.kv.assign(static_cast<size_t>(num_rows) * pr.row_stride, 0);
  pr.mx.assign(static_cast<size_t>(num_rows) * 20, 0);
  std::vector<char> used(num_rows, 0);
  for (int64_t r : token_row) if (r >= 0) used[r] = 1;
  for (int64_t r = 0; r < num_rows; ++r) fill_row(c, pr, c.fmt, r, !used[r], rng);
  if (c.nan_scale_token0 && token_row[0] >= 0) pr.mx[token_row[0] * 20 + 3] = 0xff;

  std::normal_distribution<float> nd(0.f, 1.f);
  pr.q.resize(static_cast<size_t>(total_q) * c.heads * kHeadDimQK);
  for (auto& x : pr.q) x = to_bf16(nd(rng));
  if (c.q_spread > 0 || c.q_shift != 0) {  // powers of two keep bf16 values exact
    std::uniform_int_distribution<int> k(-c.q_spread, c.q_spread / 4);
    for (size_t row = 0; row < pr.q.size(); row += kHeadDimQK) {
      const float f = std::ldexp(1.f, c.q_shift + k(rng));
      for (int d = 0; d < kHeadDimQK; ++d) pr.q[row + d] = to_bf16(bf16_value(pr.q[row + d]) * f);
    }
  }
  const int64_t out_head = kHeadDimV + kOutPad, out_token = c.heads * out_head + kOutPad;
  const int64_t lse_token = c.heads + 3;
  pr.out.assign(static_cast<size_t>(total_q) * out_token, kSentinel);
  pr.lse.assign(static_cast<size_t>(total_q) * lse_token, kLseSentinel);

  p.q = pr.q.data();
  p.q_stride_token = static_cast<int64_t>(c.heads) * kHeadDimQK;
  p.q_stride_head = kHeadDimQK;
  p.kv = pr.kv.data();
  p.kv_row_stride_bytes = pr.row_stride;
  p.fp8_scale = &pr.fp8_scale;
  p.mx_scale = pr.mx.data();
  p.mx_scale_stride_row = 20;
  p.mx_scale_stride_col = 1;
  p.qo_indptr = pr.qo_indptr.data();
  p.kv_indptr = pr.kv_indptr.empty() ? nullptr : pr.kv_indptr.data();
  p.kv_indices = pr.kv_indices.empty() ? nullptr : pr.kv_indices.data();
  p.block_table = pr.block_table.empty() ? nullptr : pr.block_table.data();
  p.kv_lens = pr.kv_lens.empty() ? nullptr : pr.kv_lens.data();
  p.out = pr.out.data();
  p.out_stride_token = out_token;
  p.out_stride_head = out_head;
  p.lse = pr.lse.data();
  p.lse_stride_token = lse_token;
  p.lse_stride_head = 1;
}

// Returns the number of failed rows (prints the first few); rel_fro: the
// relative Frobenius error of the finite rows, lse_err: the largest absolute
// LSE error.
int check(const Case& c, const Problem& pr, int splits, double* rel_fro, double* lse_err) {
  const MlaDecodeParams& p = pr.p;
  double err2 = 0, ref2 = 0;  // relative Frobenius error over the rows with a finite reference
  const int B = p.batch;
  int bad = 0;
  auto fail = [&](int t, int h, const char* what, double got, double want) {
    if (++bad <= 5) {
      printf("    FAIL %s (splits %d): token %d head %d: %s got %.6g want %.6g\n", c.name.c_str(), splits, t, h,
             what, got, want);
    }
  };
  std::vector<double> s, o(kHeadDimV);
  for (int t = 0; t < p.total_q; ++t) {
    int b = -1;
    for (int i = 0; i < B; ++i) if (t >= pr.qo_indptr[i] && t < pr.qo_indptr[i + 1]) b = i;
    for (int h = 0; h < p.num_heads; ++h) {
      const uint16_t* out = pr.out.data() + t * p.out_stride_token + h * p.out_stride_head;
      const float lse = pr.lse[t * p.lse_stride_token + h];
      for (int d = kHeadDimV; d < kHeadDimV + kOutPad; ++d) {
        if (out[d] != kSentinel) fail(t, h, "write past the row", out[d], kSentinel);
      }
      bool want_nan = b < 0, empty = false;
      double ref_lse = 0, vmax = 0;  // vmax: largest |V| among the keys the row sees
      if (!want_nan) {
        const int L = kv_length(p, b), Q = pr.qo_indptr[b + 1] - pr.qo_indptr[b];
        const int vis = visible_keys(L, Q, t - pr.qo_indptr[b]);
        const uint16_t* q = pr.q.data() + t * p.q_stride_token + h * p.q_stride_head;
        s.assign(vis, 0.0);
        for (int j = 0; j < vis && !want_nan; ++j) {
          const int64_t r = kv_row(p, b, j);
          if (r < 0) { want_nan = true; break; }
          double acc = 0;
          for (int d = 0; d < kHeadDimQK; ++d) acc += bf16_value(q[d]) * kv_value(pr, c.fmt, r, d);
          s[j] = acc * p.sm_scale;
          if (std::isnan(s[j])) want_nan = true;
        }
        empty = vis == 0;
        if (!want_nan && !empty) {
          double m = -INFINITY;
          for (double x : s) m = std::max(m, x);
          double l = 0;
          std::fill(o.begin(), o.end(), 0.0);
          for (int j = 0; j < vis; ++j) {
            const double e = std::exp(s[j] - m);
            l += e;
            const int64_t r = kv_row(p, b, j);
            for (int d = 0; d < kHeadDimV; ++d) {
              const double v = kv_value(pr, c.fmt, r, d);
              o[d] += e * v;
              vmax = std::max(vmax, std::fabs(v));
            }
          }
          for (double& x : o) x /= l;
          ref_lse = m + std::log(l);
          for (double x : o) if (std::isnan(x)) want_nan = true;
        }
      }
      if (want_nan) {
        if (!std::isnan(lse)) fail(t, h, "lse (want NaN)", lse, NAN);
        for (int d = 0; d < kHeadDimV; ++d) {
          if (!std::isnan(bf16_value(out[d]))) { fail(t, h, "out (want NaN)", bf16_value(out[d]), NAN); break; }
        }
      } else if (empty) {
        if (!(std::isinf(lse) && lse < 0)) fail(t, h, "lse (want -inf)", lse, -INFINITY);
        for (int d = 0; d < kHeadDimV; ++d) {
          if (out[d] != 0) { fail(t, h, "out (want 0)", bf16_value(out[d]), 0); break; }
        }
      } else {
        if (!(std::fabs(lse - ref_lse) < kLseAbsTol)) fail(t, h, "lse", lse, ref_lse);
        *lse_err = std::max(*lse_err, std::fabs(lse - ref_lse));
        for (int d = 0; d < kHeadDimV; ++d) {
          const double got = bf16_value(out[d]);
          err2 += (got - o[d]) * (got - o[d]);
          ref2 += o[d] * o[d];
        }
        for (int d = 0; d < kHeadDimV; ++d) {
          const double got = bf16_value(out[d]);
          if (!(std::fabs(got - o[d]) <= 4e-3 * vmax + 8e-3 * std::fabs(o[d]))) {
            char what[32];
            snprintf(what, sizeof what, "out[%d]", d);
            fail(t, h, what, got, o[d]);
            break;
          }
        }
      }
    }
  }
  *rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  // The test suite's contract (tests/cases.py REL_FRO_TOL): relative Frobenius
  // error against exact float64 math on the same dequantised cache < 8e-3.
  if (!(*rel_fro < kRelFroTol)) {
    printf("    FAIL %s (splits %d): relative Frobenius error %.3e >= %.0e\n", c.name.c_str(), splits, *rel_fro,
           kRelFroTol);
    ++bad;
  }
  return bad;
}

// Exhaustive checks of the kernel's register dequantisers (kernels/cdna/mfma_kernel.cuh)
// against the scalar decoders of formats.h: every fp8 byte in every position,
// every E8M0 scale with every E2M1 code in every position. Returns failures.
int check_decoders() {
  int bad = 0;
  auto bf = [](uint32_t bits16) { return bf16_bits_to_float(static_cast<uint16_t>(bits16)); };
  auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  auto fp8 = [&](auto tag) {
    constexpr KvFormat F = decltype(tag)::value;
    const float ratio = cuda::mfma::Fmt<F>::kFp8Ratio;
    std::mt19937 rng(7);
    for (int pos = 0; pos < 4; ++pos) {
      for (uint32_t c = 0; c < 256; ++c) {
        const uint32_t w = (rng() & ~(0xffu << (8 * pos))) | (c << (8 * pos));
        const auto r = cuda::mfma::fp8x4_to_bf16<F>(w);
        for (int i = 0; i < 4; ++i) {
          const uint8_t code = static_cast<uint8_t>(w >> (8 * i));
          const float want = F == KvFormat::kFp8E4M3FNUZ ? e4m3fnuz_to_float(code) : e4m3fn_to_float(code);
          const float got = bf((i < 2 ? r.x : r.y) >> (16 * (i % 2))) * ratio;
          if (!same(got, want) && ++bad <= 5) {
            printf("    FAIL fp8 decoder %s: code 0x%02x -> %g, want %g\n", fmt_name(F), code, got, want);
          }
        }
      }
    }
  };
  fp8(std::integral_constant<KvFormat, KvFormat::kFp8E4M3FN>{});
  fp8(std::integral_constant<KvFormat, KvFormat::kFp8E4M3FNUZ>{});
  std::mt19937 rng(11);
  for (uint32_t e = 0; e < 256; ++e) {
    for (int rep = 0; rep < 8; ++rep) {
      cuda::mfma::u32x4_t w;
      for (int k = 0; k < 4; ++k) w[k] = rng();
      if (rep == 0) w = cuda::mfma::u32x4_t{0x76543210u, 0xfedcba98u, 0x89abcdefu, 0x01234567u};
      uint32_t out[16];
      cuda::mfma::mx_chunk_to_bf16(w, e, out);
      for (int d = 0; d < 32; ++d) {
        const uint32_t nib = (w[d / 8] >> (4 * (d % 8))) & 0xf;
        const float want = e2m1_to_float(nib) * e8m0_to_float(static_cast<uint8_t>(e));
        const float got = bf(out[d / 2] >> (16 * (d % 2)));
        const bool sign_ok = std::isnan(want) || std::signbit(got) == std::signbit(want);
        if ((!same(got, want) || !sign_ok) && ++bad <= 5) {
          printf("    FAIL mxfp4 decoder: code %u scale %u -> %g, want %g\n", nib, e, got, want);
        }
      }
    }
  }
  printf("%s  register dequantisers: fp8 (both flavours, 1024 codes each), MXFP4 (256 scales x 16 codes)\n",
         bad ? "FAIL" : "ok  ");
  return bad;
}

// ---- fp8-MFMA path: the instruction emulation and the kernel's fp8 helpers ----

// The target's fp8 flavour as formats.h decodes it (independent of the
// emulator's own decoder).
float target_fp8(uint8_t c) {
#if defined(__gfx950__)
  return e4m3fn_to_float(c);
#else
  return e4m3fnuz_to_float(c);
#endif
}

// One wave: A (16 x 32 fp8, row-major) and B (32 x 16) are handed to the MFMA
// builtins in the layout the kernel's header documents; D (16 x 16) written
// back from that layout.
__global__ void mfma_fp8_probe(const uint8_t* A, const uint8_t* B, const float* C, float* D) {
  const int l = threadIdx.x, i = l % 16, g = l / 16;
  uint64_t a = 0, b = 0;
  for (int j = 0; j < 8; ++j) {
    a |= static_cast<uint64_t>(A[i * 32 + 8 * g + j]) << (8 * j);   // A[i][8g + j]
    b |= static_cast<uint64_t>(B[(8 * g + j) * 16 + i]) << (8 * j); // B[8g + j][col i]
  }
  emu::f32x4 c;
  for (int r = 0; r < 4; ++r) c[r] = C[(4 * g + r) * 16 + i];
  const emu::f32x4 d = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(static_cast<long>(a), static_cast<long>(b), c, 0, 0, 0);
  for (int r = 0; r < 4; ++r) D[(4 * g + r) * 16 + i] = d[r];
}
__global__ void mfma_bf16_probe(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const int l = threadIdx.x, i = l % 16, g = l / 16;
  emu::bf16x4 a, b;
  for (int j = 0; j < 4; ++j) {
    a[j] = static_cast<short>(A[i * 16 + 4 * g + j]);
    b[j] = static_cast<short>(B[(4 * g + j) * 16 + i]);
  }
  emu::f32x4 c;
  for (int r = 0; r < 4; ++r) c[r] = C[(4 * g + r) * 16 + i];
  const emu::f32x4 d = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
  for (int r = 0; r < 4; ++r) D[(4 * g + r) * 16 + i] = d[r];
}

// The emulated MFMAs against a scalar matrix product (float64, formats.h
// decoders): random codes of every kind (subnormals and zeros included; one
// trial with a NaN code in A, whose row must be NaN).
int check_mfma() {
  int bad = 0;
  std::mt19937 rng(21);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint8_t> A(16 * 32), B(32 * 16);
    std::vector<float> C(256), D(256), Db(256);
    for (auto& x : A) { x = static_cast<uint8_t>(rng()); if (std::isnan(target_fp8(x))) x = 0x11; }
    for (auto& x : B) { x = static_cast<uint8_t>(rng()); if (std::isnan(target_fp8(x))) x = 0x22; }
    for (auto& x : C) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.f;
    const int nan_row = trial == 7 ? 5 : -1;
#if defined(__gfx950__)
    if (nan_row >= 0) A[nan_row * 32 + 13] = 0x7f;
#else
    if (nan_row >= 0) A[nan_row * 32 + 13] = 0x80;
#endif
    emu::launch(mfma_fp8_probe, dim3(1), dim3(64), A.data(), B.data(), C.data(), D.data());
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        double want = C[i * 16 + j];
        for (int k = 0; k < 32; ++k) want += static_cast<double>(target_fp8(A[i * 32 + k])) * target_fp8(B[k * 16 + j]);
        const double got = D[i * 16 + j];
        const bool ok = i == nan_row ? std::isnan(got) : std::fabs(got - want) <= 1e-6 * std::max(1.0, std::fabs(want));
        if (!ok && ++bad <= 5) printf("    FAIL fp8 MFMA emulation: D[%d][%d] = %g, want %g\n", i, j, got, want);
      }
    }
    // bf16 16x16x16: bf16 values of random floats.
    std::vector<uint16_t> Ab(16 * 16), Bb(16 * 16);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : Ab) x = to_bf16(nd(rng));
    for (auto& x : Bb) x = to_bf16(nd(rng));
    emu::launch(mfma_bf16_probe, dim3(1), dim3(64), Ab.data(), Bb.data(), C.data(), Db.data());
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        double want = C[i * 16 + j];
        for (int k = 0; k < 16; ++k) want += bf16_value(Ab[i * 16 + k]) * bf16_value(Bb[k * 16 + j]);
        if (!(std::fabs(Db[i * 16 + j] - want) <= 1e-6 * std::max(1.0, std::fabs(want))) && ++bad <= 5) {
          printf("    FAIL bf16 MFMA emulation: D[%d][%d] = %g, want %g\n", i, j, Db[i * 16 + j], want);
        }
      }
    }
  }
  printf("%s  MFMA emulation vs scalar matrix product: fp8 16x16x32 (%s), bf16 16x16x16 (20 random matrices each)\n",
         bad ? "FAIL" : "ok  ",
#if defined(__gfx950__)
         "OCP e4m3fn"
#else
         "e4m3fnuz"
#endif
  );
  return bad;
}

// The kernel's fp8 helpers (kernels/cdna/mfma_kernel.cuh), for both flavours:
//   * fp8_split of every bf16 value below the Q bound 2^(kFp8TopExp + 1):
//     hi + lo == x exactly where x's bf16 ulp is at least the fp8 subnormal
//     quantum, within half a quantum elsewhere; no code is out of range or
//     NaN (and never 0x80 in fnuz);
//   * fp8_split of P values (all bf16 values in [0, 1] plus 2^20 random
//     floats) times kFp8PScale: |hi + lo - x| <= 2^-8 |x| + quantum / 2;
//   * NaN -> NaN code;
//   * fp8_ocp_bytes_as_fnuz on every byte in every position.
int check_fp8_helpers() {
  int bad = 0;
  auto one = [&](auto ocp_tag) {
    constexpr bool kOcp = decltype(ocp_tag)::value;
    const int top = kOcp ? 7 : 6;
    const double quantum = kOcp ? std::ldexp(1.0, -9) : std::ldexp(1.0, -10);
    const int min_exact_exp = (kOcp ? -6 : -7) + 4;
    const double pscale = kOcp ? 256.0 : 128.0;
    auto dec = [](uint32_t c) { return kOcp ? e4m3fn_to_float(static_cast<uint8_t>(c)) : e4m3fnuz_to_float(static_cast<uint8_t>(c)); };
    auto codes_ok = [&](uint32_t c) {
      const uint32_t h = c & 0xff, l = c >> 8;
      return !std::isnan(dec(h)) && !std::isnan(dec(l)) && l <= 0xff;
    };
    const char* fl = kOcp ? "OCP" : "fnuz";
    for (uint32_t b = 0; b < 0x10000; ++b) {
      const float x = bf16_bits_to_float(static_cast<uint16_t>(b));
      if (!std::isfinite(x) || std::fabs(x) >= std::ldexp(1.0, top + 1)) continue;
      const uint32_t c = cuda::mfma::fp8_split<kOcp>(x);
      const double got = static_cast<double>(dec(c & 0xff)) + dec(c >> 8);
      int ex;
      std::frexp(x, &ex);  // x = f 2^ex, f in [0.5, 1): exponent ex - 1
      const bool exact = x != 0 && ex - 1 >= min_exact_exp;
      const double tol = exact ? 0.0 : quantum / 2;
      if ((!codes_ok(c) || !(std::fabs(got - x) <= tol)) && ++bad <= 5) {
        printf("    FAIL fp8_split (%s) of bf16 %g: codes 0x%02x 0x%02x -> %.9g\n", fl, x, c & 0xff, c >> 8, got);
      }
    }
    std::mt19937 rng(5);
    for (uint32_t n = 0; n < (1u << 20) + 0x3f81; ++n) {
      float p;
      if (n <= 0x3f80) p = bf16_bits_to_float(static_cast<uint16_t>(n));  // every bf16 in [0, 1]
      else p = std::ldexp(static_cast<float>(rng() >> 8) / 16777216.f, -static_cast<int>(rng() % 24));
      const float x = p * static_cast<float>(pscale);
      const uint32_t c = cuda::mfma::fp8_split<kOcp>(x);
      const double got = static_cast<double>(dec(c & 0xff)) + dec(c >> 8);
      if ((!codes_ok(c) || !(std::fabs(got - x) <= std::ldexp(std::fabs(x), -8) + quantum / 2)) && ++bad <= 5) {
        printf("    FAIL fp8_split (%s) of P %g: codes 0x%02x 0x%02x -> %.9g\n", fl, x, c & 0xff, c >> 8, got);
      }
    }
    if (!std::isnan(dec(cuda::mfma::fp8_split<kOcp>(NAN) & 0xff)) && ++bad <= 5) printf("    FAIL fp8_split (%s) of NaN\n", fl);
  };
  one(std::integral_constant<bool, false>{});
  one(std::integral_constant<bool, true>{});
  std::mt19937 rng(9);
  for (int pos = 0; pos < 4; ++pos) {
    for (uint32_t c = 0; c < 256; ++c) {
      const uint32_t w = (rng() & ~(0xffu << (8 * pos))) | (c << (8 * pos));
      const uint32_t f = cuda::mfma::fp8_ocp_bytes_as_fnuz(w);
      for (int i = 0; i < 4; ++i) {
        const float want = e4m3fn_to_float(static_cast<uint8_t>(w >> (8 * i)));
        const float got = 2.f * e4m3fnuz_to_float(static_cast<uint8_t>(f >> (8 * i)));
        if (!((std::isnan(want) && std::isnan(got)) || want == got) && ++bad <= 5) {
          printf("    FAIL fp8_ocp_bytes_as_fnuz: OCP 0x%02x -> fnuz 0x%02x\n", (w >> (8 * i)) & 0xff, (f >> (8 * i)) & 0xff);
        }
      }
    }
  }
  printf("%s  fp8-MFMA helpers: fp8_split (both flavours: every bf16 Q value, 2^20 P values), OCP bytes -> fnuz\n",
         bad ? "FAIL" : "ok  ");
  return bad;
}

#if defined(__gfx950__)
// ---- gfx950: the CDNA4 instructions and the gfx950 kernel's Q split ---------

// One wave: A (16 x 128 codes of format kFa, row-major), B (128 x 16 codes of
// kFb), SA (16 x 4 E8M0: row, K block), SB (4 x 16: K block, column) handed
// to the scaled MFMA in the layout of the CDNA4 ISA (7.1.5.1, 7.2.1), with
// the scale in byte `kOpsel` of its register; kUnscaled passes the constant
// scales 0 (the unscaled opcode).
template <int kFa, int kFb, int kOpsel, bool kUnscaled>
__global__ void mfma_scale_probe(const uint8_t* A, const uint8_t* B, const uint8_t* SA, const uint8_t* SB,
                                 const float* C, float* D) {
  const int l = threadIdx.x, rc = l % 16, g = l / 16;
  auto place = [&](int fmt, auto code_at) {  // this lane's 8 operand registers
    uint32_t r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (fmt <= 1) {
      for (int byte = 0; byte < 32; ++byte) {
        const int k = byte < 16 ? 16 * g + byte : 64 + 16 * g + (byte - 16);
        r[byte / 4] |= code_at(k) << (8 * (byte % 4));
      }
    } else {
      for (int n = 0; n < 32; ++n) r[n / 8] |= (code_at(32 * g + n) & 0xfu) << (4 * (n % 8));
    }
    emu::i32x8 v;
    for (int i = 0; i < 8; ++i) v[i] = static_cast<int>(r[i]);
    return v;
  };
  const emu::i32x8 a = place(kFa, [&](int k) { return static_cast<uint32_t>(A[rc * 128 + k]); });
  const emu::i32x8 b = place(kFb, [&](int k) { return static_cast<uint32_t>(B[k * 16 + rc]); });
  // Other bytes of the scale registers hold junk: OPSEL must pick byte kOpsel.
  const int sa = static_cast<int>((0x5a5a5a5au & ~(0xffu << 8 * kOpsel)) | static_cast<uint32_t>(SA[rc * 4 + g]) << 8 * kOpsel);
  const int sb = static_cast<int>(static_cast<uint32_t>(SB[g * 16 + rc]) << 8 * kOpsel);
  emu::f32x4 c;
  for (int r = 0; r < 4; ++r) c[r] = C[(4 * g + r) * 16 + rc];
  emu::f32x4 d;
  if constexpr (kUnscaled) {
    d = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, kFa, kFb, 0, 0, 0, 0);
  } else {
    d = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, kFa, kFb, kOpsel, sa, kOpsel, sb);
  }
  for (int r = 0; r < 4; ++r) D[(4 * g + r) * 16 + rc] = d[r];
}
__global__ void mfma_bf16_k32_probe(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const int l = threadIdx.x, i = l % 16, g = l / 16;
  uint16_t av[8], bv[8];
  for (int j = 0; j < 8; ++j) {
    av[j] = A[i * 32 + 8 * g + j];
    bv[j] = B[(8 * g + j) * 16 + i];
  }
  emu::Bf16x8Bits a, b;
  memcpy(a.data(), av, 16);
  memcpy(b.data(), bv, 16);
  emu::f32x4 c;
  for (int r = 0; r < 4; ++r) c[r] = C[(4 * g + r) * 16 + i];
  const emu::f32x4 d = __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, 0, 0, 0);
  for (int r = 0; r < 4; ++r) D[(4 * g + r) * 16 + i] = d[r];
}

// formats.h's decoders for the formats the kernels feed the MFMA (E4M3 OCP,
// E2M1), independent of the emulator's.
double ref_code(int fmt, uint8_t c) { return fmt == 0 ? e4m3fn_to_float(c) : e2m1_to_float(c & 0xf); }

template <int kFa, int kFb, int kOpsel, bool kUnscaled>
int check_scaled_mfma_case(std::mt19937& rng, int trial) {
  int bad = 0;
  std::vector<uint8_t> A(16 * 128), B(128 * 16), SA(16 * 4), SB(4 * 16);
  std::vector<float> C(256), D(256);
  auto code = [&](int fmt) {
    uint8_t x = static_cast<uint8_t>(rng());
    if (fmt == 0 && std::isnan(e4m3fn_to_float(x))) x = 0x3c;
    return fmt == 0 ? x : static_cast<uint8_t>(x & 0xf);
  };
  for (auto& x : A) x = code(kFa);
  for (auto& x : B) x = code(kFb);
  for (auto& x : SA) x = static_cast<uint8_t>(rng() % 40 == 0 ? rng() % 255 : 112 + rng() % 30);  // 0..254 now and then
  for (auto& x : SB) x = static_cast<uint8_t>(rng() % 40 == 0 ? rng() % 255 : 112 + rng() % 30);
  for (auto& x : C) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.f;
  int nan_row = -1, nan_col = -1;
  if (trial == 3) { SA[5 * 4 + 2] = 0xff; nan_row = 5; }                 // NaN block scale of row 5
  if (trial == 4 && kFb == 0) { B[77 * 16 + 9] = 0x7f; nan_col = 9; }    // NaN code in column 9
  if (trial == 5) { SA[3 * 4 + 1] = 0; SB[1 * 16 + 7] = 0; }             // E8M0 0: 2^-127 (a runtime 0)
  emu::launch(mfma_scale_probe<kFa, kFb, kOpsel, kUnscaled>, dim3(1), dim3(64), A.data(), B.data(), SA.data(),
              SB.data(), C.data(), D.data());
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      double want = C[i * 16 + j], mag = std::fabs(want);
      for (int kb = 0; kb < 4; ++kb) {
        double blk = 0, blk_mag = 0;
        for (int k = 32 * kb; k < 32 * kb + 32; ++k) {
          const double t = ref_code(kFa, A[i * 128 + k]) * ref_code(kFb, B[k * 16 + j]);
          blk += t;
          blk_mag += std::fabs(t);
        }
        const double sc = kUnscaled ? 1.0 : static_cast<double>(e8m0_to_float(SA[i * 4 + kb])) *
                                                std::ldexp(1.0, SB[kb * 16 + j] - 127);
        want += blk * sc;
        mag += blk_mag * sc;
      }
      const double got = D[i * 16 + j];
      const bool want_nan = (!kUnscaled && i == nan_row) || j == nan_col;
      const float wf = static_cast<float>(want);
      const bool ok = want_nan      ? std::isnan(got)
                      : std::isinf(wf) ? got == wf
                                       : std::fabs(got - want) <= 1e-6 * mag + 1e-38;
      if (!ok && ++bad <= 5) {
        printf("    FAIL scaled MFMA emulation (A fmt %d, B fmt %d, opsel %d%s): D[%d][%d] = %g, want %g\n", kFa, kFb,
               kOpsel, kUnscaled ? ", unscaled" : "", i, j, got, want);
      }
    }
  }
  return bad;
}

int check_gfx950_instructions() {
  int bad = 0;
  std::mt19937 rng(31);
  for (int trial = 0; trial < 8; ++trial) {
    bad += check_scaled_mfma_case<4, 0, 0, false>(rng, trial);  // E2M1 x E4M3 (MXFP4 QK)
    bad += check_scaled_mfma_case<0, 0, 0, false>(rng, trial);  // E4M3 x E4M3 (fp8 QK)
    bad += check_scaled_mfma_case<4, 4, 2, false>(rng, trial);
    bad += check_scaled_mfma_case<0, 4, 3, false>(rng, trial);
    bad += check_scaled_mfma_case<0, 0, 1, false>(rng, trial);
    bad += check_scaled_mfma_case<4, 0, 0, true>(rng, trial);   // the unscaled opcode
  }
  // bf16 16x16x32.
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint16_t> A(16 * 32), B(32 * 16);
    std::vector<float> C(256), D(256);
    for (auto& x : A) x = to_bf16(nd(rng) * (trial == 7 ? 1e-38f : 1.f));  // trial 7: bf16 subnormals
    for (auto& x : B) x = to_bf16(nd(rng));
    for (auto& x : C) x = nd(rng);
    emu::launch(mfma_bf16_k32_probe, dim3(1), dim3(64), A.data(), B.data(), C.data(), D.data());
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        double want = C[i * 16 + j], mag = std::fabs(want);
        for (int k = 0; k < 32; ++k) {
          want += bf16_value(A[i * 32 + k]) * bf16_value(B[k * 16 + j]);
          mag += std::fabs(bf16_value(A[i * 32 + k]) * bf16_value(B[k * 16 + j]));
        }
        if (!(std::fabs(D[i * 16 + j] - want) <= 1e-6 * mag) && ++bad <= 5) {
          printf("    FAIL bf16 16x16x32 MFMA emulation: D[%d][%d] = %g, want %g\n", i, j, D[i * 16 + j], want);
        }
      }
    }
  }
  // The converts: every byte in every position with every E8M0 scale (FP4);
  // every 16-bit word in both positions with a spread of scales (FP8).
  auto bfv = [](uint32_t bits16) { return bf16_bits_to_float(static_cast<uint16_t>(bits16)); };
  auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); };
  for (uint32_t e = 0; e < 256; ++e) {
    const float sc_op = __uint_as_float(e << 23 | (e == 7 ? 0x12345u : 0u));  // mantissa bits are ignored
    for (uint32_t byte = 0; byte < 256; ++byte) {
      for (int sel = 0; sel < 4; ++sel) {
        const uint32_t src = (static_cast<uint32_t>(rng()) & ~(0xffu << 8 * sel)) | byte << 8 * sel;
        emu::Bf16x2Bits r;
        switch (sel) {
          case 0: r = __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, sc_op, 0); break;
          case 1: r = __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, sc_op, 1); break;
          case 2: r = __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, sc_op, 2); break;
          default: r = __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, sc_op, 3); break;
        }
        uint32_t u;
        memcpy(&u, &r, 4);
        for (int h = 0; h < 2; ++h) {
          const float want = e2m1_to_float((byte >> 4 * h) & 0xf) * e8m0_to_float(static_cast<uint8_t>(e));
          const float got = bfv(u >> 16 * h);
          if (!same(got, want) && ++bad <= 5) {
            printf("    FAIL cvt_scalef32_pk_bf16_fp4: byte 0x%02x nibble %d scale %u -> %g, want %g\n", byte, h, e,
                   got, want);
          }
        }
      }
    }
  }
  const uint32_t fp8_scales[] = {127, 0, 1, 100, 126, 128, 140, 254, 255};
  for (uint32_t e : fp8_scales) {
    for (uint32_t w = 0; w < 0x10000; ++w) {
      for (int sel = 0; sel < 2; ++sel) {
        const uint32_t src = sel ? (w << 16 | 0x7f7f) : (0x7f7f0000u | w);
        const emu::Bf16x2Bits r = sel ? __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(src, __uint_as_float(e << 23), true)
                                  : __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(src, __uint_as_float(e << 23), false);
        uint32_t u;
        memcpy(&u, &r, 4);
        for (int h = 0; h < 2; ++h) {
          // Exact in fp32; bf16 rounds the products below its normal range (RNE).
          const float exact = e4m3fn_to_float(static_cast<uint8_t>(w >> 8 * h)) * e8m0_to_float(static_cast<uint8_t>(e));
          const float want = std::isnan(exact) ? exact : std::copysign(bf16_value(to_bf16(exact)), exact);
          const float got = bfv(u >> 16 * h);
          if (!same(got, want) && ++bad <= 5) {
            printf("    FAIL cvt_scalef32_pk_bf16_fp8: word 0x%04x half %d scale %u -> %g, want %g\n", w, h, e, got,
                   want);
          }
        }
      }
    }
  }
  printf("%s  gfx950 instruction emulation: scaled 16x16x128 MFMA vs scalar (E2M1/E4M3 operands, OPSEL 0-3, NaN and "
         "zero scales, unscaled opcode; 48 matrices), bf16 16x16x32 (20), cvt_scalef32_pk_bf16_fp4 (every byte x "
         "scale x position), _fp8 (every word, 9 scales)\n",
         bad ? "FAIL" : "ok  ");
  return bad;
}

// The gfx950 kernel's Q split (kernels/cdna/mfma_gfx950.cuh, q_split16, 16
// values at a time as the kernel calls it): for every bf16 x with |x| < 256
// (the scaled range), hi + lo / 32 == x exactly when |x| >= 2^-7, else
// within 2^-15; |hi| <= 256; no code NaN; NaN -> NaN codes. And the scale
// exponent puts every amax in [2^7, 2^8).
int check_gfx950_q_split() {
  namespace k = cuda::mfma::gfx950;
  int bad = 0;
  std::vector<uint16_t> xs;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float x = bf16_bits_to_float(static_cast<uint16_t>(bits));
    if (std::isfinite(x) && std::fabs(x) < 256.f) xs.push_back(static_cast<uint16_t>(bits));
  }
  xs.push_back(0x7fc0);  // NaN
  while (xs.size() % 16) xs.push_back(0);
  for (size_t base = 0; base < xs.size(); base += 16) {
    uint32_t words[8];
    for (int w = 0; w < 8; ++w) words[w] = xs[base + 2 * w] | static_cast<uint32_t>(xs[base + 2 * w + 1]) << 16;
    const cuda::mfma::u32x4_t v[2] = {{words[0], words[1], words[2], words[3]}, {words[4], words[5], words[6], words[7]}};
    cuda::mfma::u32x4_t hi, lo;
    k::q_split16(v[0], v[1], 1.f, hi, lo);
    for (int e = 0; e < 16; ++e) {
      const float x = bf16_bits_to_float(xs[base + e]);
      const uint8_t ch = static_cast<uint8_t>(hi[e / 4] >> (8 * (e % 4))), cl = static_cast<uint8_t>(lo[e / 4] >> (8 * (e % 4)));
      const float h = e4m3fn_to_float(ch), l = e4m3fn_to_float(cl);
      if (std::isnan(x)) {
        if (!(std::isnan(h) && std::isnan(l)) && ++bad <= 5) printf("    FAIL gfx950 q_split16 of NaN\n");
        continue;
      }
      const double got = static_cast<double>(h) + static_cast<double>(l) / 32.0;
      const double tol = std::fabs(x) >= 0x1p-7 ? 0.0 : 0x1p-15;
      if ((std::isnan(h) || std::isnan(l) || std::fabs(h) > 256.f || !(std::fabs(got - x) <= tol)) && ++bad <= 5) {
        printf("    FAIL gfx950 q_split16 of %g: codes 0x%02x 0x%02x -> %.10g\n", x, ch, cl, got);
      }
    }
  }
  for (int e = -115; e <= 127; ++e) {
    for (float m : {1.f, 1.5f, 1.9921875f}) {
      const float amax = std::ldexp(m, e);
      const int se = k::q_scale_exp(amax);
      const double x = std::ldexp(static_cast<double>(amax), se);
      if (!(x >= 128.0 && x < 256.0) && ++bad <= 5) printf("    FAIL gfx950 q_scale_exp(%g) = %d\n", amax, se);
    }
  }
  printf("%s  gfx950 Q split: every bf16 value of the scaled range (exact from 2^-7, else within 2^-15), NaN, scale "
         "exponent for 2^-115..2^127\n",
         bad ? "FAIL" : "ok  ");
  return bad;
}
#endif  // __gfx950__

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the lines printed before a crash
  using F = KvFormat;
  using L = KvLayout;
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(std::move(c)); };
  {
    Case c; c.name = "bf16 indptr H16 decode"; c.q_lens = {1, 1}; c.kv_lens = {45, 77}; c.seed = 1; add(c);
  }
  {
    Case c; c.name = "bf16 indptr H20 (partial head group) 3 splits"; c.heads = 20; c.q_lens = {1}; c.kv_lens = {100};
    c.splits = 3; c.seed = 2; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn indices, one bad index"; c.fmt = F::kFp8E4M3FN; c.layout = L::kIndptrIndices;
    c.q_lens = {1, 1}; c.kv_lens = {50, 20}; c.bad_token = 3; c.seed = 3; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fnuz paged P16 causal q_len 2, 2 splits"; c.fmt = F::kFp8E4M3FNUZ; c.layout = L::kPaged;
    c.page_size = 16; c.q_lens = {2, 1}; c.kv_lens = {70, 33}; c.splits = 2; c.seed = 4; add(c);
  }
  {
    Case c; c.name = "mxfp4 paged P64, empty item, auto splits"; c.fmt = F::kMxfp4; c.layout = L::kPaged;
    c.page_size = 64; c.q_lens = {1, 1}; c.kv_lens = {130, 0}; c.splits = 0; c.seed = 5; add(c);
  }
  {
    Case c; c.name = "mxfp4 indptr H40 causal q_len 3"; c.fmt = F::kMxfp4; c.heads = 40; c.q_lens = {3};
    c.kv_lens = {65}; c.seed = 6; add(c);
  }
  {
    Case c; c.name = "bf16 indices, the only key is bad"; c.layout = L::kIndptrIndices; c.q_lens = {1, 1};
    c.kv_lens = {1, 40}; c.bad_token = 0; c.seed = 7; add(c);
  }
  {
    Case c; c.name = "bf16 orphan query token"; c.q_lens = {1}; c.kv_lens = {33}; c.orphan = true; c.seed = 8; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn 7 splits over 40 keys (empty splits)"; c.fmt = F::kFp8E4M3FN; c.q_lens = {1};
    c.kv_lens = {40}; c.splits = 7; c.seed = 9; add(c);
  }
  {
    Case c; c.name = "mxfp4 NaN block scale on a used row, 2 splits"; c.fmt = F::kMxfp4; c.q_lens = {1, 1};
    c.kv_lens = {40, 90}; c.nan_scale_token0 = true; c.splits = 2; c.seed = 10; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fnuz indices causal q_len 4, auto splits"; c.fmt = F::kFp8E4M3FNUZ;
    c.layout = L::kIndptrIndices; c.q_lens = {4}; c.kv_lens = {97}; c.splits = 0; c.seed = 11; add(c);
  }
  {
    Case c; c.name = "bf16 paged P1 H128, auto splits"; c.layout = L::kPaged; c.page_size = 1; c.heads = 128;
    c.q_lens = {1}; c.kv_lens = {300}; c.splits = 0; c.seed = 12; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn paged P64 bad page, 2 splits"; c.fmt = F::kFp8E4M3FN; c.layout = L::kPaged;
    c.page_size = 64; c.q_lens = {1, 1}; c.kv_lens = {150, 70}; c.bad_token = 140; c.splits = 2; c.seed = 13;
    add(c);
  }

  {
    Case c; c.name = "fp8_e4m3fn indptr H128 kv 520, auto splits"; c.fmt = F::kFp8E4M3FN; c.heads = 128;
    c.q_lens = {1}; c.kv_lens = {520}; c.splits = 0; c.seed = 14; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fnuz indptr H16 kv 2000, 1 split"; c.fmt = F::kFp8E4M3FNUZ; c.q_lens = {1};
    c.kv_lens = {2000}; c.splits = 1; c.seed = 15; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn indptr H16 kv 2000, 1 split"; c.fmt = F::kFp8E4M3FN; c.q_lens = {1};
    c.kv_lens = {2000}; c.splits = 1; c.seed = 16; add(c);
  }

  // More than 8 splits: the combine's variants for 9-16 splits (chunks of 16) and for more
  // (chunks of 32), one row per block.
  {
    Case c; c.name = "mxfp4 ragged 900/5/0/130, 12 splits (9-16 variant)"; c.fmt = F::kMxfp4;
    c.q_lens = {1, 1, 1, 1}; c.kv_lens = {900, 5, 0, 130}; c.splits = 12; c.seed = 40; add(c);
  }
  {
    Case c; c.name = "bf16 ragged 1200/5/0/260, 40 splits (two chunks)"; c.q_lens = {1, 1, 1, 1};
    c.kv_lens = {1200, 5, 0, 260}; c.splits = 40; c.seed = 17; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn indices bad index, 24 splits"; c.fmt = F::kFp8E4M3FN; c.layout = L::kIndptrIndices;
    c.q_lens = {1, 1}; c.kv_lens = {400, 64}; c.bad_token = 10; c.splits = 24; c.seed = 18; add(c);
  }

  // Every format, H 16 / 32 / 64 / 128, q_len 1-4, ragged lengths with 0,
  // all three layouts.
  {
    Case c; c.name = "bf16 indices H32 causal q_len 2, ragged 70/0/3"; c.layout = L::kIndptrIndices; c.heads = 32;
    c.q_lens = {2, 2, 2}; c.kv_lens = {70, 0, 3}; c.splits = 0; c.seed = 19; add(c);
  }
  {
    Case c; c.name = "bf16 paged P16 H64 causal q_len 4, 2 splits"; c.layout = L::kPaged; c.page_size = 16;
    c.heads = 64; c.q_lens = {4, 4}; c.kv_lens = {90, 41}; c.splits = 2; c.seed = 20; add(c);
  }
  {
    Case c; c.name = "bf16 indices H128 causal q_len 2"; c.layout = L::kIndptrIndices; c.heads = 128;
    c.q_lens = {2, 2}; c.kv_lens = {64, 130}; c.splits = 0; c.seed = 21; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn paged P1 H32 causal q_len 3, ragged 37/1/0"; c.fmt = F::kFp8E4M3FN;
    c.layout = L::kPaged; c.page_size = 1; c.heads = 32; c.q_lens = {3, 3, 3}; c.kv_lens = {37, 1, 0};
    c.splits = 0; c.seed = 22; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn indices H64 ragged 200/33"; c.fmt = F::kFp8E4M3FN; c.layout = L::kIndptrIndices;
    c.heads = 64; c.q_lens = {1, 1}; c.kv_lens = {200, 33}; c.splits = 0; c.seed = 23; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn paged P64 H128 causal q_len 2"; c.fmt = F::kFp8E4M3FN; c.layout = L::kPaged;
    c.page_size = 64; c.heads = 128; c.q_lens = {2}; c.kv_lens = {150}; c.splits = 0; c.seed = 24; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn q magnitudes 2^-24..2^6, 3 splits"; c.fmt = F::kFp8E4M3FN; c.q_lens = {1, 1};
    c.kv_lens = {300, 17}; c.q_spread = 24; c.splits = 3; c.seed = 25; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fn indptr causal q_len 4, ragged 5/300"; c.fmt = F::kFp8E4M3FN; c.q_lens = {4, 4};
    c.kv_lens = {5, 300}; c.splits = 0; c.seed = 26; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fnuz indptr H32 ragged 0/64/130"; c.fmt = F::kFp8E4M3FNUZ; c.heads = 32;
    c.q_lens = {1, 1, 1}; c.kv_lens = {0, 64, 130}; c.splits = 0; c.seed = 27; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fnuz paged P16 H64 causal q_len 3"; c.fmt = F::kFp8E4M3FNUZ; c.layout = L::kPaged;
    c.page_size = 16; c.heads = 64; c.q_lens = {3}; c.kv_lens = {80}; c.splits = 1; c.seed = 28; add(c);
  }
  {
    Case c; c.name = "fp8_e4m3fnuz indices H128"; c.fmt = F::kFp8E4M3FNUZ; c.layout = L::kIndptrIndices;
    c.heads = 128; c.q_lens = {1}; c.kv_lens = {100}; c.splits = 0; c.seed = 29; add(c);
  }
  {
    Case c; c.name = "mxfp4 indices ragged 1/0/95/32, auto splits"; c.fmt = F::kMxfp4; c.layout = L::kIndptrIndices;
    c.q_lens = {1, 1, 1, 1}; c.kv_lens = {1, 0, 95, 32}; c.splits = 0; c.seed = 30; add(c);
  }
  {
    Case c; c.name = "mxfp4 paged P16 H32 causal q_len 2, 2 splits"; c.fmt = F::kMxfp4; c.layout = L::kPaged;
    c.page_size = 16; c.heads = 32; c.q_lens = {2, 2}; c.kv_lens = {77, 140}; c.splits = 2; c.seed = 31; add(c);
  }
  {
    Case c; c.name = "mxfp4 indptr H64 causal q_len 4, ragged 45/3"; c.fmt = F::kMxfp4; c.heads = 64;
    c.q_lens = {4, 4}; c.kv_lens = {45, 3}; c.splits = 0; c.seed = 32; add(c);
  }
  {
    Case c; c.name = "mxfp4 indices H128 kv 300, auto splits"; c.fmt = F::kMxfp4; c.layout = L::kIndptrIndices;
    c.heads = 128; c.q_lens = {1}; c.kv_lens = {300}; c.splits = 0; c.seed = 33; add(c);
  }
  {
    // Scores of order 1-100, as in use (the LSE bound is absolute).
    Case c; c.name = "mxfp4 block scales 2^-17..2^17, q 2^-25..2^-15"; c.fmt = F::kMxfp4; c.q_lens = {1};
    c.kv_lens = {200}; c.mx_lo = 110; c.mx_hi = 144; c.q_shift = -17; c.q_spread = 8; c.splits = 2; c.seed = 34;
    add(c);
  }
  {
    Case c; c.name = "mxfp4 indptr H16 kv 2000, 1 split"; c.fmt = F::kMxfp4; c.q_lens = {1}; c.kv_lens = {2000};
    c.splits = 1; c.seed = 35; add(c);
  }
  {
    Case c; c.name = "mxfp4 indices H20 bad index, 24 splits"; c.fmt = F::kMxfp4; c.layout = L::kIndptrIndices;
    c.heads = 20; c.q_lens = {1, 1}; c.kv_lens = {400, 64}; c.bad_token = 10; c.splits = 24; c.seed = 36; add(c);
  }

  int failed = check_decoders() != 0;
  failed += check_mfma() != 0;
  failed += check_fp8_helpers() != 0;
#if defined(__gfx950__)
  failed += check_gfx950_instructions() != 0;
  failed += check_gfx950_q_split() != 0;
#endif
  for (const Case& c : cases) {
    Problem pr;
    build(c, pr);
    plan::DeviceFacts dev;
    dev.vendor = plan::Vendor::kAmd;
    dev.arch = kArch;
    dev.num_sms = kNumCus;
    dev.smem_per_block_optin = dev.smem_per_sm = 64 * 1024;  // CDNA LDS (the MFMA plan ignores it)
    plan::Overrides ov;
    ov.num_splits = c.splits;
    const plan::Plan plan = plan::make_plan(pr.p, dev, ov);
    std::vector<float> ws((plan::workspace_bytes(pr.p, plan) + 3) / 4 + 4);
    const uint64_t blocks0 = emu::state().blocks_run;
    const hipError_t err = cuda::launch_decode(pr.p, plan, ws.data(), nullptr);
    const uint64_t blocks = emu::state().blocks_run - blocks0;
    double rel_fro = 0, lse_err = 0;
    int bad = err == hipSuccess ? check(c, pr, plan.num_splits, &rel_fro, &lse_err) : 1;
    if (err != hipSuccess) printf("    FAIL %s: launch_decode returned %d\n", c.name.c_str(), err);
    printf("%s  %-52s %-13s H=%-3d splits=%-2d workgroups=%-4llu rel_fro=%.2e lse_err=%.1e\n", bad ? "FAIL" : "ok  ",
           c.name.c_str(), fmt_name(c.fmt), c.heads, plan.num_splits, static_cast<unsigned long long>(blocks), rel_fro,
           lse_err);
    failed += bad != 0;
  }
  printf("hip_emu: %zu cases, %d failed\n", cases.size(), failed);
  return failed ? 1 : 0;
}
