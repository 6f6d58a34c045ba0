// Times the CPU kernel's paths one piece at a time, without torch: the
// measurement tool behind the AMX and AVX-512 figures of docs/cpu-kernel.md.
// Each timed call runs one piece over all keys of one item (one query token,
// H heads in groups of 16), rotating over enough items that their cache rows
// exceed the last-level cache, so every call streams its rows from DRAM as a
// long decode does. Prints TSC ticks per key and per key and group; built with
// -DMLA_CPU_PROFILE it also prints the phase totals (decode, qk, softmax,
// transpose, pv) at exit. Not part of the extension (setup.py compiles
// csrc/cpu/*.cpp only). Build and run on one core:
//   g++ -O3 -std=c++17 -I csrc -o /tmp/piece_bench csrc/cpu/tools/piece_bench.cpp
//       csrc/cpu/kernel_amx.cpp csrc/cpu/kernel_avx512.cpp csrc/cpu/kernel_avx2.cpp csrc/cpu/kernel_scalar.cpp
//       csrc/cpu/cpu_features.cpp
//   taskset -c 2 /tmp/piece_bench amx mxfp4 16 8192
// Arguments: path (amx, avx512, avx512_fp32, avx2, scalar), format (bf16, fp8, mxfp4),
// H (1..128), keys per item, optionally the calls to time (default: about 2e9 TSC ticks
// of calls; 0 for that default) and the MB of cache rows to rotate over (default 1024).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/kernel_common.h"
#include "cpu/tools/synthetic.h"

using namespace mla_decode;
using tools::bf16_of;

namespace {

// A path this CPU cannot run (exit status 3, so scripts can tell it from a usage error).
int refuse(const char* why) {
  fprintf(stderr, "piece_bench: %s\n", why);
  return 3;
}

int usage(const char* why) {
  fprintf(stderr, "piece_bench: %s\nusage: piece_bench PATH FORMAT H KEYS [CALLS [ROTATE_MB]]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage("too few arguments");
  const std::string path = argv[1], fmt = argv[2];
  const int H = atoi(argv[3]);
  const int keys = atoi(argv[4]);
  if (H < 1 || H > kMaxHeads) return usage("H must be 1..128");
  if (keys < 1) return usage("KEYS must be positive");
  void (*piece)(const cpu::PieceArgs&, const cpu::CallScales&) = nullptr;
  const cpu::CpuFeatures& cpu = cpu::cpu_features();
  if (path == "amx") {
    if (!cpu.amx_bf16) return refuse("this CPU lacks AMX-BF16 (or the OS does not enable the tile state)");
    if (const char* why = cpu::amx_permission()) return usage(why);
    piece = &cpu::piece_amx;
  } else if (path == "avx512") {
    if (!cpu.avx512_bf16) return refuse("this CPU lacks AVX-512 BF16 (or the OS does not enable the zmm state)");
    piece = &cpu::piece_avx512;
  } else if (path == "avx512_fp32") {
    if (!cpu.avx512_f) return refuse("this CPU lacks AVX-512 F/BW/VL/DQ (or the OS does not enable the zmm state)");
    piece = &cpu::piece_avx512_fp32;
  } else if (path == "avx2") {
    if (!cpu.avx2_fma) return refuse("this CPU lacks AVX2, FMA, F16C and BMI2 (or the OS does not enable the ymm state)");
    piece = &cpu::piece_avx2;
  } else if (path == "scalar") {
    piece = &cpu::piece_scalar;
  } else {
    return usage("PATH must be amx, avx512, avx512_fp32, avx2 or scalar");
  }
  if (path != "scalar" && !cpu::vector_paths_built()) {
    return refuse("this build has no vector paths (not x86-64 GCC or clang)");
  }
  KvFormat format;
  int row_bytes;
  if (fmt == "bf16") {
    format = KvFormat::kBf16;
    row_bytes = 2 * kHeadDimQK;
  } else if (fmt == "fp8") {
    format = KvFormat::kFp8E4M3FN;
    row_bytes = kHeadDimQK;
  } else if (fmt == "mxfp4") {
    format = KvFormat::kMxfp4;
    row_bytes = kMxfp4RowBytes;
  } else {
    return usage("FORMAT must be bf16, fp8 or mxfp4");
  }
  const double rotate_mb = argc > 6 ? atof(argv[6]) : 1024.0;
  const int64_t item_bytes = static_cast<int64_t>(keys) * (row_bytes + (format == KvFormat::kMxfp4 ? 18 : 0));
  const int items = static_cast<int>(std::max<int64_t>(1, static_cast<int64_t>(rotate_mb * 1e6) / item_bytes));
  const int64_t rows = static_cast<int64_t>(items) * keys;

  // Rows as a quantiser makes them from Gaussian data: bf16 N(0, 1); fp8 the
  // nearest e4m3 code of N(0, 1) x 64 (drawn from a pool; a per-tensor scale that puts the
  // largest values near 448, so subnormal codes are as rare as in a real
  // cache); MXFP4 random E2M1 codes with block exponents 120..130.
  std::mt19937_64 rng(1);
  std::vector<uint8_t> kv(static_cast<size_t>(rows) * row_bytes);
  std::vector<uint8_t> mx(format == KvFormat::kMxfp4 ? static_cast<size_t>(rows) * 18 : 0);
  if (format == KvFormat::kBf16) {
    std::normal_distribution<float> nd;
    uint16_t* w = reinterpret_cast<uint16_t*>(kv.data());
    for (size_t i = 0; i < kv.size() / 2; ++i) w[i] = bf16_of(nd(rng));
  } else if (format == KvFormat::kFp8E4M3FN) {
    // Codes drawn from a pool of 2^16 quantised samples: quantising every
    // byte of a 256 MB rotation one by one took longer than the timing.
    const tools::E4m3Quantiser e4m3;
    std::normal_distribution<float> nd;
    std::vector<uint8_t> pool(1 << 16);
    for (auto& c : pool) c = e4m3.code(nd(rng) * 64.f);
    uint64_t bits = 0;
    for (size_t i = 0; i < kv.size(); ++i) {
      if (i % 4 == 0) bits = rng();
      kv[i] = pool[(bits >> (16 * (i % 4))) & 0xFFFF];
    }
  } else {
    uint64_t bits = 0;
    for (size_t i = 0; i < kv.size(); ++i) {
      if (i % 8 == 0) bits = rng();
      kv[i] = static_cast<uint8_t>(bits >> (8 * (i % 8)));
    }
    for (size_t i = 0; i < mx.size(); ++i) mx[i] = static_cast<uint8_t>(120 + rng() % 11);
  }
  std::vector<uint16_t> q(static_cast<size_t>(H) * kHeadDimQK);
  {
    std::normal_distribution<float> nd;
    for (auto& v : q) v = bf16_of(nd(rng));
  }
  std::vector<int32_t> kv_indptr(items + 1);
  for (int i = 0; i <= items; ++i) kv_indptr[i] = i * keys;
  const float fp8_scale = 0.02f;

  MlaDecodeParams p;
  p.batch = items;
  p.num_heads = H;
  p.total_q = 1;
  p.num_cache_rows = rows;
  p.sm_scale = 0.0416666f;
  p.q = q.data();
  p.q_stride_token = static_cast<int64_t>(H) * kHeadDimQK;
  p.q_stride_head = kHeadDimQK;
  tools::set_dense_cache(p, format, kv.data(), row_bytes, &fp8_scale, mx.empty() ? nullptr : mx.data(),
                         kv_indptr.data());

  const int ng = (H + cpu::kGroupRows - 1) / cpu::kGroupRows;
  std::vector<cpu::GroupDesc> groups(ng);
  for (int g = 0; g < ng; ++g) {
    groups[g] = cpu::GroupDesc{0, g * cpu::kGroupRows, std::min(cpu::kGroupRows, H - g * cpu::kGroupRows), keys};
  }
  float* O = static_cast<float*>(aligned_alloc(64, sizeof(float) * ng * cpu::kOFloats));
  std::vector<float> m(ng * 16), l(ng * 16);
  // The vector paths work on the fp8 codes and fold the tensor scale into both
  // factors; the scalar path decodes code x scale (kernel_common.h).
  const float folded = format == KvFormat::kFp8E4M3FN && path != "scalar" ? fp8_scale : 1.f;
  const cpu::CallScales cs{p.sm_scale * folded, folded};
  auto run = [&](int item) {
    cpu::PieceArgs a{&p, item, groups.data(), ng, 0, keys, O, m.data(), l.data()};
    piece(a, cs);
  };
  run(0);  // first touch of the scratch, tile configuration
  uint64_t t0 = __rdtsc();
  run(1 % items);
  const uint64_t one = __rdtsc() - t0;
  const long asked = argc > 5 ? atol(argv[5]) : 0;  // 0: about 2e9 ticks of calls
  const long calls = asked > 0 ? asked : std::max<long>(20, static_cast<long>(2e9 / std::max<uint64_t>(one, 1)));
  double sum = 0;
  for (int g = 0; g < ng * 16; ++g) sum += l[g];  // keep the results alive
  t0 = __rdtsc();
  for (long c = 0; c < calls; ++c) run(static_cast<int>(c % items));
  const double ticks = static_cast<double>(__rdtsc() - t0) / calls;
  printf("%s %s H=%d keys=%d groups=%d items=%d calls=%ld: %.0f ticks per call, %.1f per key, %.1f per key and group "
         "(check %.3g)\n",
         path.c_str(), fmt.c_str(), H, keys, ng, items, calls, ticks, ticks / keys, ticks / keys / ng, sum);
  free(O);
  return 0;
}
