// Prints the split plan (kernel, head groups, splits, ring stages, shared
// memory) of csrc/cuda/decode_launch.cu for a grid of shapes, formats,
// layouts, SM counts and device shared-memory limits, one line per input, so
// two trees' plans can be compared without a GPU (scripts/plan_compare.sh;
// trees from session 11 on, which have the narrow kernel). No kernel is
// launched: only plan_splits runs. The fp8 wgmma kernel is off (as if
// MLA_DECODE_FP8_KERNEL were unset). The Hopper wide and narrow kernels
// apply as on an H100/H200 with a 9.0a build and the switches unset, as this
// tree sets their defaults (every format by plan): for the inputs with 132
// SMs and 227 KB per block, aligned rows (the harness's inputs are), wide for
// bf16 / OCP fp8 / MXFP4 at H >= 64, narrow for OCP fp8 / MXFP4 at H < 64;
// so their size thresholds are compared too. (Against a tree whose default
// kept a format off a Hopper kernel, that format's differences are the
// harness's, not the plan's: session 11's fp8 narrow opt-in, for one.)
// Every input's device has a 50 MiB L2 (the H100/H200's); a plan whose TMA
// tile loads take the L2 stream hint (SplitPlan::stream_kv) ends in " stream".
#include "cuda/decode_launch.cu"
#if __has_include("cuda/sm90/decode_kernel_narrow_fp8_sm90.cuh")  // session 15 on: the register-V kernel
#define PLAN_HAS_REGISTER_V 1
#include "cuda/sm90/decode_kernel_narrow_fp8_sm90.cuh"
#else
#define PLAN_HAS_REGISTER_V 0
#include "cuda/sm90/decode_kernel_narrow_sm90.cuh"
#endif
#include "cuda/sm90/decode_kernel_wide_sm90.cuh"

#include <cstdio>

namespace mla_decode {
namespace cuda {
// The device being planned for: Hopper-like when it has 132 SMs and 227 KB
// of shared memory per block.
bool g_hopper = false;
bool fp8_uses_wgmma(const MlaDecodeParams&) { return false; }
cudaError_t launch_fp8_wgmma(const DecodeLaunch&, cudaStream_t) { return cudaErrorNotSupported; }
int wide_smem_bytes() { return sm90::wide::Smem::kTotal; }
int wide_tile_tokens() { return sm90::wide::kTileTokensDefault; }
bool wide_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
  const bool format_ok = p.format == KvFormat::kBf16 || p.format == KvFormat::kFp8E4M3FN || p.format == KvFormat::kMxfp4;
  return g_hopper && format_ok && p.num_heads >= kWideRows && smem_per_block_optin >= wide_smem_bytes();
}
bool wide_kernel_forced(KvFormat) { return false; }
cudaError_t launch_wide(const DecodeLaunch&, cudaStream_t) { return cudaErrorNotSupported; }
// As decode_narrow_sm90.cu: the larger of the narrow kernel's layout and the
// register-V kernel's (session 15 on) or the e4m3-QK variant's (session 14,
// which defines MLA_NARROW_HAS_TMA in the narrow header); earlier trees had one.
#if PLAN_HAS_REGISTER_V
int narrow_smem_bytes() { return std::max(sm90::narrow::Smem::kTotal, sm90::narrow_fp8::Smem::kTotal); }
#elif defined(MLA_NARROW_HAS_TMA) && MLA_NARROW_HAS_TMA
int narrow_smem_bytes() { return std::max(sm90::narrow::Smem::kTotal, sm90::narrow::SmemE4m3::kTotal); }
#else
int narrow_smem_bytes() { return sm90::narrow::Smem::kTotal; }
#endif
int narrow_tile_tokens() { return sm90::narrow::kTileTokens; }
bool narrow_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#ifdef MLA_DECODE_NARROW_BF16  // session 16 on: bf16 of the indptr layout too (TMA-landed tiles)
  const bool bf16_ok = p.format == KvFormat::kBf16 && p.layout == KvLayout::kIndptr;
#else
  const bool bf16_ok = false;
#endif
  const bool format_ok = p.format == KvFormat::kFp8E4M3FN || p.format == KvFormat::kMxfp4 || bf16_ok;
  return g_hopper && format_ok && p.num_heads < kWideRows && smem_per_block_optin >= narrow_smem_bytes();
}
bool narrow_kernel_forced(KvFormat) { return false; }
// The register-V form as on an H200 with tensor maps and the switches unset,
// for the harness's inputs (rows present, the cache's own stride): every OCP
// fp8 call of the indptr layout (trees from session 15 on ask; earlier trees
// never call it).
bool narrow_register_v_applies(const MlaDecodeParams& p) {
  return p.format == KvFormat::kFp8E4M3FN && p.layout == KvLayout::kIndptr;
}
cudaError_t launch_narrow(const DecodeLaunch&, cudaStream_t) { return cudaErrorNotSupported; }
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
                    g_hopper = sms == 132 && lim[0] == 232448;
                    dev.num_sms = sms;
                    dev.smem_per_block_optin = lim[0];
                    dev.smem_per_sm = lim[1];
#ifdef MLA_DECODE_L2_STREAM_HINT  // session 17 on: the L2 stream hint needs the L2 size (H100/H200: 50 MiB)
                    dev.l2_bytes = 50ll << 20;
#endif
                    const SplitPlan plan = plan_splits(p, dev, requested);
#ifdef MLA_DECODE_L2_STREAM_HINT
                    const char* stream = plan.stream_kv ? " stream" : "";
#else
                    const char* stream = "";
#endif
                    const char* kernel = plan.wide ? "wide" : plan.narrow ? "narrow" : "mma";
                    std::printf("fmt%d lay%d H%d B%d q%d kv%d req%d sm%d lim%d: %s groups %d splits %d stages %d smem %d%s\n",
                                static_cast<int>(f), static_cast<int>(layout), heads, batch, q_len, kv, requested, sms,
                                lim[0], kernel, plan.head_groups, plan.num_splits, plan.stages, plan.smem_bytes, stream);
                    ++n;
                  }
  std::fprintf(stderr, "%ld plans\n", n);
  return 0;
}
