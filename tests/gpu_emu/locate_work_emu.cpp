// Host emulation of the GPU kernels' work assignment: compiles
// csrc/kernels/common/work.cuh (locate_work) and csrc/common/addressing.h as
// plain C++ and runs them for every (query token, KV split) CTA of a call, to
// predict which query rows a GPU call writes as NaN: an orphan token (no item
// owns it, or its item's index values cannot be trusted), or a token that
// sees a key whose cache row is outside the cache. tests/test_gpu_contract_emu.py
// builds it (with AddressSanitizer where available: every index array is its
// own exact-size allocation, so a read past one is an error) and compares
// the prediction with the hostile cases' expectations.
//
// stdin (integers): layout page_size max_pages num_cache_rows num_kv_indices
//   total_q batch num_splits chunk_align, then qo_indptr (batch + 1), then
//   kv_indptr (batch + 1) [+ kv_indices (num_kv_indices)] or kv_lens (batch) +
//   block_table (batch x max_pages).
// stdout: per token "t b orphan nan visible": b = the item locate_work
//   found, visible = the keys its splits cover (-1 when they do not tile
//   [0, visible) in order; 0 for an orphan).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};
static EmuDim3 blockIdx;
#define __device__
#define __forceinline__ inline
template <typename T>
inline T __ldg(const T* ptr) {
  return *ptr;
}
using std::max;
using std::min;

#include "kernels/common/work.cuh"

using namespace mla_decode;

static long long read_int() {
  long long v;
  if (std::scanf("%lld", &v) != 1) {
    std::fprintf(stderr, "locate_work_emu: truncated input\n");
    std::exit(2);
  }
  return v;
}

// An exact-size heap array (so AddressSanitizer sees any read past it).
static std::unique_ptr<int32_t[]> read_array(long long n) {
  std::unique_ptr<int32_t[]> a(new int32_t[n > 0 ? n : 1]);
  for (long long i = 0; i < n; ++i) a[i] = static_cast<int32_t>(read_int());
  return a;
}

template <int kChunkAlign>
static void run(const cuda::DecodeLaunch& args) {
  const MlaDecodeParams& p = args.p;
  for (int t = 0; t < p.total_q; ++t) {
    bool orphan = false, nan = false;
    int covered = 0, item = -1;
    bool tiles = true;
    for (int s = 0; s < args.num_splits; ++s) {
      blockIdx.x = static_cast<unsigned>(t * args.head_groups);
      blockIdx.y = static_cast<unsigned>(s);
      const cuda::WorkItem w = cuda::locate_work<kChunkAlign>(args);
      if (item >= 0 && item != w.b) tiles = false;  // every split of a token must agree on its item
      item = w.b;
      orphan = orphan || w.orphan;
      if (w.orphan) continue;
      if (w.kv_begin != covered || w.kv_end < w.kv_begin) tiles = false;
      covered = w.kv_end > covered ? w.kv_end : covered;
      // The kernels' key loop: row kv_indptr[b] + j (indptr layout) or kv_row (the others).
      const bool contiguous = p.layout == KvLayout::kIndptr;
      const int64_t base = contiguous ? p.kv_indptr[w.b] : 0;
      if (static_cast<int64_t>(w.kv_end) - w.kv_begin > (1 << 22)) continue;  // too long to walk here
      for (int j = w.kv_begin; j < w.kv_end; ++j) {
        const int64_t r = contiguous ? base + j : kv_row(p, w.b, j);
        if (r < 0 || r >= p.num_cache_rows) nan = true;
      }
    }
    std::printf("%d %d %d %d %d\n", t, item, orphan ? 1 : 0, (orphan || nan) ? 1 : 0,
                orphan ? 0 : (tiles ? covered : -1));
  }
}

int main() {
  MlaDecodeParams p;
  p.layout = static_cast<KvLayout>(read_int());
  p.page_size = static_cast<int32_t>(read_int());
  p.max_pages_per_seq = static_cast<int32_t>(read_int());
  p.num_cache_rows = read_int();
  p.num_kv_indices = read_int();
  p.total_q = static_cast<int32_t>(read_int());
  p.batch = static_cast<int32_t>(read_int());
  const int num_splits = static_cast<int>(read_int());
  const int chunk_align = static_cast<int>(read_int());
  auto qo = read_array(p.batch + 1);
  p.qo_indptr = qo.get();
  std::unique_ptr<int32_t[]> kvp, idx, lens, table;
  if (p.layout == KvLayout::kPaged) {
    lens = read_array(p.batch);
    table = read_array(static_cast<long long>(p.batch) * p.max_pages_per_seq);
    p.kv_lens = lens.get();
    p.block_table = table.get();
    p.block_table_stride = p.max_pages_per_seq;
  } else {
    kvp = read_array(p.batch + 1);
    p.kv_indptr = kvp.get();
    if (p.layout == KvLayout::kIndptrIndices) {
      idx = read_array(p.num_kv_indices);
      p.kv_indices = idx.get();
    }
  }
  cuda::DecodeLaunch args;
  args.p = p;
  args.num_splits = num_splits;
  args.head_groups = 1;
  // As launch_decode computes it.
  args.q_per_item = (p.batch > 0 && p.total_q % p.batch == 0) ? p.total_q / p.batch : 0;
  if (chunk_align == 32) {
    run<32>(args);
  } else if (chunk_align == 64) {
    run<64>(args);
  } else {
    std::fprintf(stderr, "locate_work_emu: chunk_align must be 32 or 64\n");
    return 2;
  }
  return 0;
}
