// Prints the split plan (head groups, splits, ring stages, shared memory) of
// csrc/cuda/decode_launch.cu for a grid of shapes, formats, layouts, SM
// counts and device shared-memory limits, one line per input, so two trees'
// plans can be compared without a GPU (scripts/plan_compare.sh). The Hopper
// fp8 wgmma kernel is stubbed out (as if MLA_DECODE_FP8_KERNEL were unset), so
// is the wide kernel (as if MLA_DECODE_BF16_KERNEL=mma and MLA_DECODE_FP8_KERNEL=mma), and no kernel is
// launched: only plan_splits runs.
#include "cuda/decode_launch.cu"

#include <cstdio>

namespace mla_decode {
namespace cuda {
bool fp8_uses_wgmma(const MlaDecodeParams&) { return false; }
cudaError_t launch_fp8_wgmma(const DecodeLaunch&, cudaStream_t) { return cudaErrorNotSupported; }
int wide_smem_bytes() { return 0; }
int wide_tile_tokens() { return 64; }
bool wide_kernel_applies(const MlaDecodeParams&, int) { return false; }
cudaError_t launch_wide(const DecodeLaunch&, cudaStream_t) { return cudaErrorNotSupported; }
template <KvFormat F>
cudaError_t launch_split_kernel(const DecodeLaunch&, cudaStream_t) { return cudaErrorNotSupported; }
template cudaError_t launch_split_kernel<KvFormat::kBf16>(const DecodeLaunch&, cudaStream_t);
template cudaError_t launch_split_kernel<KvFormat::kFp8E4M3FN>(const DecodeLaunch&, cudaStream_t);
template cudaError_t launch_split_kernel<KvFormat::kFp8E4M3FNUZ>(const DecodeLaunch&, cudaStream_t);
template cudaError_t launch_split_kernel<KvFormat::kMxfp4>(const DecodeLaunch&, cudaStream_t);
}  // namespace cuda
}  // namespace mla_decode

using namespace mla_decode;
using namespace mla_decode::cuda;

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
                    DeviceLimits dev;
                    dev.num_sms = sms;
                    dev.smem_per_block_optin = lim[0];
                    dev.smem_per_sm = lim[1];
                    const SplitPlan plan = plan_splits(p, dev, requested);
                    std::printf("fmt%d lay%d H%d B%d q%d kv%d req%d sm%d lim%d: groups %d splits %d stages %d smem %d\n",
                                static_cast<int>(f), static_cast<int>(layout), heads, batch, q_len, kv, requested, sms,
                                lim[0], plan.head_groups, plan.num_splits, plan.stages, plan.smem_bytes);
                    ++n;
                  }
  std::fprintf(stderr, "%ld plans\n", n);
  return 0;
}
