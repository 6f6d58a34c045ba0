// Which rows and keys one CTA (workgroup) of a split kernel works on, shared
// by the mma.sync kernel (decode_kernel.cuh), the wgmma kernel
// (sm90/decode_kernel_sm90.cuh) and the MFMA kernel (decode_kernel_mfma.cuh).
// Grid: x = query token t * head_groups + head group, y = KV split
// (decode_common.h states the contract).
#pragma once

#include "common/addressing.h"
#include "common/params.h"
#include "kernels/common/launch_contract.h"

namespace mla_decode {
namespace cuda {

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct WorkItem {
  int t;         // query token
  int h0;        // first head of the group (kRows heads: kTileRows, or kWideRows for the wide kernel)
  int split;     // KV split index
  int b;         // batch item owning token t
  bool orphan;   // no item owns t (inconsistent qo_indptr): the rows become NaN
  int kv_begin;  // this split's visible keys: [kv_begin, kv_end)
  int kv_end;
};

// The query token, first head and KV split of this CTA: blockIdx alone (the
// grid contract), so a kernel may use them before it reads any memory.
// kRows: heads per CTA (the plan's head_groups = ceil(H / kRows)).
struct CtaCoords {
  int t;
  int h0;
  int split;
};
template <int kRows = kTileRows>
__device__ __forceinline__ CtaCoords cta_coords(const DecodeLaunch& args) {
  CtaCoords c;
  c.t = blockIdx.x / args.head_groups;
  c.h0 = (blockIdx.x % args.head_groups) * kRows;
  c.split = blockIdx.y;
  return c;
}

// kChunkAlign: the split chunk is rounded up to a multiple of it (the kernel's
// tokens per pipeline stage), so only a split's last stage is partial.
template <int kChunkAlign, int kRows = kTileRows>
__device__ __forceinline__ WorkItem locate_work(const DecodeLaunch& args) {
  const MlaDecodeParams& p = args.p;
  WorkItem w;
  const CtaCoords cta = cta_coords<kRows>(args);
  w.t = cta.t;
  w.h0 = cta.h0;
  w.split = cta.split;
  // Item b owns token t when qo_indptr[b] <= t < qo_indptr[b+1]. Guess b from
  // an even split of the queries (exact for the usual uniform q_len) and load
  // the guess's query and KV bounds in one round trip; fall back to a binary
  // search when the guess is wrong.
  const int t = w.t;
  const int b_guess = args.q_per_item > 0 ? min(t / args.q_per_item, p.batch - 1) : 0;
  int q_begin = __ldg(p.qo_indptr + b_guess);
  int q_end = __ldg(p.qo_indptr + b_guess + 1);
  const int kv_len_guess = kv_length(p, b_guess);
  int b = b_guess;
  if (t < q_begin || t >= q_end) {
    int lo = 0, hi = p.batch - 1;  // largest b with qo_indptr[b] <= t
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (__ldg(p.qo_indptr + mid) <= t) lo = mid; else hi = mid - 1;
    }
    b = lo;
    q_begin = __ldg(p.qo_indptr + b);
    q_end = __ldg(p.qo_indptr + b + 1);
  }
  w.b = b;
  w.orphan = t < q_begin || t >= q_end;
  const int kv_len = w.orphan ? 0 : (b == b_guess ? kv_len_guess : kv_length(p, b));
  const int visible = w.orphan ? 0 : visible_keys(kv_len, q_end - q_begin, t - q_begin);
  const int chunk = ceil_div(ceil_div(visible, args.num_splits), kChunkAlign) * kChunkAlign;
  w.kv_begin = min(w.split * chunk, visible);
  w.kv_end = min(w.kv_begin + chunk, visible);
  return w;
}

}  // namespace cuda
}  // namespace mla_decode
