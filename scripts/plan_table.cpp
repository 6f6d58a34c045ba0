// Prints the decode plan (csrc/plan) of a grid of ~166k inputs, one line each:
// shapes, formats, layouts, SM counts and per-block shared-memory limits, with
// the device Hopper-like (an sm_90a build, tensor maps, 50 MiB L2) when it has
// 132 SMs and 227 KB per block. scripts/plan_compare.sh diffs two trees'
// tables, so a change to csrc/plan shows every input whose plan it moves.
// Plain C++: g++ -std=c++17 -I csrc scripts/plan_table.cpp csrc/plan/plan.cpp
#include <cstdio>
#include <initializer_list>

#include "plan/kernel_geometry.h"
#include "plan/plan.h"

using namespace mla_decode;

int main() {
  // (per-block opt-in, per-SM) shared memory: H100/H200, A100, 99 KB parts (sm_86/89/120), too small.
  const int limits[][2] = {{232448, 233472}, {166912, 167936}, {101376, 102400}, {65536, 65536}};
  const KvFormat formats[] = {KvFormat::kBf16, KvFormat::kFp8E4M3FN, KvFormat::kFp8E4M3FNUZ, KvFormat::kMxfp4};
  const KvLayout layouts[] = {KvLayout::kIndptr, KvLayout::kIndptrIndices, KvLayout::kPaged};
  long n = 0;
  for (KvFormat f : formats)
    for (KvLayout layout : layouts)
      for (int heads : {1, 16, 17, 32, 64, 128})
        for (int batch : {1, 2, 4, 8, 32, 64, 128, 256})
          for (int q_len : {1, 2, 4})
            for (int kv : {64, 1024, 8192, 32768})
              for (int requested : {0, 3})
                for (int sms : {132, 108, 78})
                  for (const auto& lim : limits) {
                    MlaDecodeParams p;
                    p.format = f;
                    p.layout = layout;
                    p.num_heads = heads;
                    p.batch = batch;
                    p.total_q = batch * q_len;
                    p.num_cache_rows = static_cast<int64_t>(batch) * kv;
                    p.num_kv_indices = static_cast<int64_t>(batch) * kv;
                    p.page_size = 64;
                    p.max_pages_per_seq = (kv + 63) / 64;
                    p.kv_row_stride_bytes = plan::row_bytes(f);  // rows as a contiguous cache has them
                    p.q_stride_token = static_cast<int64_t>(heads) * kHeadDimQK;
                    p.q_stride_head = kHeadDimQK;
                    plan::DeviceFacts dev;
                    const bool hopper = sms == 132 && lim[0] == 232448;
                    dev.arch = hopper ? 90 : 80;
                    dev.sm90a_kernels = hopper;
                    dev.tensor_maps = hopper;
                    dev.num_sms = sms;
                    dev.smem_per_block_optin = lim[0];
                    dev.smem_per_sm = lim[1];
                    dev.l2_bytes = 50ll << 20;
                    plan::Overrides ov;
                    ov.num_splits = requested;
                    const plan::Plan plan = plan::make_plan(p, dev, ov);
                    std::printf("fmt%d lay%d H%d B%d q%d kv%d req%d sm%d lim%d: %s groups %d splits %d stages %d smem %d%s\n",
                                static_cast<int>(f), static_cast<int>(layout), heads, batch, q_len, kv, requested, sms,
                                lim[0], plan::kernel_name(plan.kernel), plan.head_groups, plan.num_splits, plan.stages,
                                plan.smem_bytes, plan.stream_kv ? " stream" : "");
                    ++n;
                  }
  std::fprintf(stderr, "%ld plans\n", n);
  return 0;
}
