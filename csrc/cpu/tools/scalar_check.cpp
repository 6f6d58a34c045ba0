// The portable (scalar) path against exact math, without torch and without
// x86 intrinsics, so that it builds and runs wherever the path does: natively
// in the tests (tests/test_cpu_tools.py), and cross-compiled for AArch64
// under qemu-aarch64 where those are installed. Not part of the extension.
//
// Each case is one piece (kernel_common.h): random bf16 queries and a random
// cache in bf16, OCP fp8 (codes of N(0, 1) x 64, tensor scale 1/64) or MXFP4
// (random E2M1 codes, block exponents 120..130), a set of head groups whose
// visible key counts grow by one per group (a causal q_len > 1), and a key
// range of the piece. The reference is float64 on the same dequantised values
// (formats.h): m, l and O of every row that sees a key, normalised as the
// driver does (out = O / l, lse = m + log l; out not rounded to bf16). The
// path works in fp32 throughout (sums of at most 576 products, exp in fp32), so
// the bound is fp32's, not the output format's: relative Frobenius error of
// out < 1e-4 per group and |lse error| < 1e-4 (measured: below 6e-6 and 2e-5).
// A group that sees no key of the piece must leave m = -inf, l = 0, O = 0.
// Prints one line per case and "scalar_check: N cases, F failed"; exit 1 on a
// failure.
//   g++ -O2 -std=c++17 -I csrc -o /tmp/scalar_check csrc/cpu/tools/scalar_check.cpp csrc/cpu/kernel_scalar.cpp
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/formats.h"
#include "cpu/kernel_common.h"
#include "cpu/tools/synthetic.h"

using namespace mla_decode;
using tools::bf16_of;

namespace {

struct Case {
  KvFormat format;
  int heads;      // heads of each token (groups of 16)
  int tokens;     // query tokens of the item (token t sees keys + t + 1 - tokens keys)
  int keys;       // keys of the item
  int key_begin;  // the piece's keys
  int key_end;
};

const char* name_of(KvFormat f) {
  return f == KvFormat::kBf16 ? "bf16" : f == KvFormat::kFp8E4M3FN ? "fp8" : "mxfp4";
}

// The value of element d of cache row r, as the kernels read it.
double value(const MlaDecodeParams& p, int64_t r, int d) {
  const uint8_t* row = static_cast<const uint8_t*>(p.kv) + r * p.kv_row_stride_bytes;
  if (p.format == KvFormat::kBf16) {
    uint16_t h;
    memcpy(&h, row + 2 * d, 2);
    return bf16_bits_to_float(h);
  }
  if (p.format == KvFormat::kFp8E4M3FN) return static_cast<double>(e4m3fn_to_float(row[d])) * *p.fp8_scale;
  const uint8_t byte = row[d / 2];
  const uint32_t nibble = d % 2 == 0 ? byte & 0xF : byte >> 4;
  return static_cast<double>(e2m1_to_float(nibble)) * e8m0_to_float(p.mx_scale[r * p.mx_scale_stride_row + d / 32]);
}

bool run_case(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  const int row_bytes = c.format == KvFormat::kBf16 ? 2 * kHeadDimQK : c.format == KvFormat::kMxfp4 ? kHeadDimQK / 2
                                                                                                      : kHeadDimQK;
  std::vector<uint8_t> kv(static_cast<size_t>(c.keys) * row_bytes);
  std::vector<uint8_t> mx(c.format == KvFormat::kMxfp4 ? static_cast<size_t>(c.keys) * 18 : 0);
  const float fp8_scale = 1.f / 64;
  if (c.format == KvFormat::kBf16) {
    for (size_t i = 0; i < kv.size(); i += 2) {
      const uint16_t h = bf16_of(nd(rng));
      memcpy(&kv[i], &h, 2);
    }
  } else if (c.format == KvFormat::kFp8E4M3FN) {
    const tools::E4m3Quantiser e4m3;  // codes of N(0, 1) x 64
    for (auto& b : kv) b = e4m3.code(nd(rng) * 64.f);
  } else {
    for (auto& b : kv) b = static_cast<uint8_t>(rng());
    for (auto& e : mx) e = static_cast<uint8_t>(120 + rng() % 11);
  }
  std::vector<uint16_t> q(static_cast<size_t>(c.tokens) * c.heads * kHeadDimQK);
  for (auto& v : q) v = bf16_of(nd(rng));
  const int32_t kv_indptr[2] = {0, c.keys};

  MlaDecodeParams p;
  p.batch = 1;
  p.num_heads = c.heads;
  p.total_q = c.tokens;
  p.num_cache_rows = c.keys;
  p.sm_scale = 1.f / std::sqrt(static_cast<float>(kHeadDimQK));
  p.q = q.data();
  p.q_stride_token = static_cast<int64_t>(c.heads) * kHeadDimQK;
  p.q_stride_head = kHeadDimQK;
  tools::set_dense_cache(p, c.format, kv.data(), row_bytes, &fp8_scale, mx.empty() ? nullptr : mx.data(),
                         kv_indptr);

  // Groups: every token's heads in groups of 16, tokens in order (visible non-decreasing).
  std::vector<cpu::GroupDesc> groups;
  for (int t = 0; t < c.tokens; ++t) {
    for (int h0 = 0; h0 < c.heads; h0 += cpu::kGroupRows) {
      groups.push_back({t, h0, std::min(cpu::kGroupRows, c.heads - h0), c.keys + t + 1 - c.tokens});
    }
  }
  if (static_cast<int>(groups.size()) > cpu::kMaxGroupsPerPiece) {
    fprintf(stderr, "scalar_check: a case has more than %d groups\n", cpu::kMaxGroupsPerPiece);
    exit(2);
  }
  const int ng = static_cast<int>(groups.size());
  std::vector<float> O(static_cast<size_t>(ng) * cpu::kOFloats, std::nanf("")), m(ng * 16, std::nanf("")),
      l(ng * 16, std::nanf(""));  // poisoned: the path must write every row it owns
  const cpu::PieceArgs a{&p, 0, groups.data(), ng, c.key_begin, c.key_end, O.data(), m.data(), l.data()};
  const cpu::CallScales cs{p.sm_scale, 1.f};
  cpu::piece_scalar(a, cs);

  bool ok = true;
  double worst_fro = 0, worst_lse = 0;
  for (int g = 0; g < ng; ++g) {
    const cpu::GroupDesc& gd = groups[g];
    const int end = std::min(c.key_end, gd.visible);
    for (int h = 0; h < gd.nh; ++h) {
      const int r = g * 16 + h;
      const float* o = O.data() + static_cast<size_t>(g) * cpu::kOFloats + static_cast<size_t>(h) * cpu::kORow;
      if (end <= c.key_begin) {  // sees no key of the piece
        bool empty = std::isinf(m[r]) && m[r] < 0 && l[r] == 0.f;
        for (int d = 0; d < kHeadDimV; ++d) empty = empty && o[d] == 0.f;
        ok = ok && empty;
        continue;
      }
      const uint16_t* qh = q.data() + (static_cast<size_t>(gd.q_row) * c.heads + gd.h0 + h) * kHeadDimQK;
      std::vector<double> s(end - c.key_begin);
      double mx_s = -INFINITY;
      for (int j = c.key_begin; j < end; ++j) {
        double dot = 0;
        for (int d = 0; d < kHeadDimQK; ++d) dot += static_cast<double>(bf16_bits_to_float(qh[d])) * value(p, j, d);
        s[j - c.key_begin] = dot * p.sm_scale;
        mx_s = std::max(mx_s, s[j - c.key_begin]);
      }
      double sum = 0, err2 = 0, ref2 = 0;
      std::vector<double> out(kHeadDimV, 0.0);
      for (int j = c.key_begin; j < end; ++j) {
        const double w = std::exp(s[j - c.key_begin] - mx_s);
        sum += w;
        for (int d = 0; d < kHeadDimV; ++d) out[d] += w * value(p, j, d);
      }
      for (int d = 0; d < kHeadDimV; ++d) {
        const double ref = out[d] / sum, got = static_cast<double>(o[d]) / l[r];
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
      }
      const double fro = std::sqrt(err2 / ref2);
      const double lse_err = std::fabs((m[r] + std::log(static_cast<double>(l[r]))) - (mx_s + std::log(sum)));
      worst_fro = std::max(worst_fro, std::isnan(fro) ? INFINITY : fro);
      worst_lse = std::max(worst_lse, std::isnan(lse_err) ? INFINITY : lse_err);
    }
  }
  ok = ok && worst_fro < 1e-4 && worst_lse < 1e-4;
  printf("%s %-5s H=%3d tokens=%d keys=%4d piece=[%d, %d) groups=%d rel_fro=%.2e lse_err=%.1e\n", ok ? "ok  " : "FAIL",
         name_of(c.format), c.heads, c.tokens, c.keys, c.key_begin, c.key_end, ng, worst_fro, worst_lse);
  return ok;
}

}  // namespace

int main() {
  const KvFormat formats[] = {KvFormat::kBf16, KvFormat::kFp8E4M3FN, KvFormat::kMxfp4};
  // Head counts for every QK form (1-2 heads by dims; 3-4, 5-8, 9-16 rows as lanes) and PV's
  // single-row tail; key ranges with partial 32-key blocks and odd ends; q_len > 1, whose
  // last-but-one token sees one key fewer (and, with a piece of one key, none).
  const Case shapes[] = {
      {KvFormat::kBf16, 1, 1, 1, 0, 1},      {KvFormat::kBf16, 2, 1, 37, 0, 37},   {KvFormat::kBf16, 3, 1, 64, 0, 64},
      {KvFormat::kBf16, 5, 1, 100, 0, 100},  {KvFormat::kBf16, 16, 1, 65, 0, 65},  {KvFormat::kBf16, 17, 1, 96, 0, 96},
      {KvFormat::kBf16, 20, 2, 130, 64, 130}, {KvFormat::kBf16, 7, 3, 33, 0, 33},  {KvFormat::kBf16, 128, 1, 40, 0, 40},
      {KvFormat::kBf16, 2, 2, 64, 63, 64},
  };
  int n = 0, failed = 0;
  uint64_t seed = 1;
  for (KvFormat f : formats) {
    for (Case c : shapes) {
      c.format = f;
      ++n;
      failed += run_case(c, seed++) ? 0 : 1;
    }
  }
  printf("scalar_check: %d cases, %d failed\n", n, failed);
  return failed ? 1 : 0;
}
