// Which rows and keys one CTA (workgroup) of a split kernel works on, shared
// by every split kernel: sm80/mma_sync_kernel.cuh, the Hopper kernels
// (sm90/wide_kernel.cuh, narrow_kernel.cuh, narrow_register_v_kernel.cuh) and
// cdna/mfma_kernel.cuh. Grid: x = query token t * head_groups + head group,
// y = KV split (launch_contract.h states the contract).
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
  bool orphan;   // no item owns t, or its item's index values cannot be trusted: the rows become NaN
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
//
// A token is an orphan (its rows become NaN, in every kernel) when no item
// owns it (qo_indptr[0] > t, or t >= qo_indptr[batch]) or when the values of
// the item that owns it cannot be trusted (item_address in
// common/addressing.h: an indptr entry out of range or a decrease at or next
// to the item, negative kv_lens or more keys than its block table holds), so
// a malformed index value gives NaN rows for the items it touches, never
// plausible numbers. The chunk arithmetic is int64: visible + num_splits and
// the rounding up to kChunkAlign may pass int32 for the longest items.
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
  // the guess's query and KV values in one round trip; fall back to a binary
  // search when the guess is wrong.
  const int t = w.t;
  int b = args.q_per_item > 0 ? min(t / args.q_per_item, p.batch - 1) : 0;
  ItemAddress item = item_address(p, b);
  if (t < item.q_begin || t >= item.q_end) {
    int lo = 0, hi = p.batch - 1;  // largest b with qo_indptr[b] <= t
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (load_index(p.qo_indptr + mid) <= t) lo = mid; else hi = mid - 1;
    }
    b = lo;
    item = item_address(p, b);
  }
  w.b = b;
  w.orphan = !item.ok || t < item.q_begin || t >= item.q_end;
  const int visible = w.orphan ? 0 : visible_keys(item.kv_len, item.q_end - item.q_begin, t - item.q_begin);
  const int64_t per_split = (static_cast<int64_t>(visible) + args.num_splits - 1) / args.num_splits;
  const int64_t chunk = (per_split + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  const int64_t begin = static_cast<int64_t>(w.split) * chunk;
  w.kv_begin = static_cast<int>(begin < visible ? begin : visible);
  w.kv_end = static_cast<int>(begin + chunk < visible ? begin + chunk : visible);
  return w;
}

}  // namespace cuda
}  // namespace mla_decode
