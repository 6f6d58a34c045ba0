"""mla_decode in a few lines: decode over a bf16, an fp8 and a paged MXFP4 cache, and the
competition's tuple interface, each checked against exact float64 math.

    python examples/quickstart.py          # GPU if present, else the CPU operator

Self-contained (the README's "Use" example is this file's body).
"""

import torch

import mla_decode
from mla_decode.inputs import generate_input, make_paged_cache
from mla_decode.quant import quantize_fp8, quantize_mxfp4
from mla_decode.reference import dequantize_cache, reference_decode, rel_error

device = "cuda" if torch.cuda.is_available() else "cpu"

# A batch of 4 sequences of 256, 1000, 17 and 1 cached tokens, one new query token each.
# Absorbed MLA: 16 query heads of 576 dims over one shared latent KV head; each cache row is
# 576 dims and V is its first 512.
lens = [256, 1000, 17, 1]
heads = 16
q = torch.randn(len(lens), heads, 576, device=device).to(torch.bfloat16)   # (total_q, H, 576)
kv_cache = torch.randn(sum(lens), 576, device=device).to(torch.bfloat16)   # (total_kv, 576) rows
qo_indptr = torch.arange(len(lens) + 1, dtype=torch.int32, device=device)  # query rows of item b
kv_indptr = torch.tensor([0, 256, 1256, 1273, 1274], dtype=torch.int32, device=device)  # its cache rows

# bf16 cache: out (4, 16, 512) bf16, lse (4, 16) float32.
out, lse = mla_decode.decode(q, kv_cache, qo_indptr, kv_indptr=kv_indptr, return_lse=True)

# fp8 cache (e4m3, one per-tensor scale).
kv_fp8, scale = quantize_fp8(kv_cache)
out_fp8 = mla_decode.decode(q, kv_fp8, qo_indptr, kv_scale=scale, kv_indptr=kv_indptr)

# MXFP4 cache (E2M1 codes, two per byte, and one E8M0 scale per 32 values), in pages of 64 tokens
# addressed through a block table.
kv_fp4, e8m0 = quantize_mxfp4(kv_cache)
pages, table, kv_lens = make_paged_cache(kv_fp4, kv_indptr, page_size=64)
scale_pages, _, _ = make_paged_cache(e8m0, kv_indptr, page_size=64)
out_fp4 = mla_decode.decode(q, pages, qo_indptr, kv_scale=scale_pages.view(-1, 18), block_table=table,
                            kv_lens=kv_lens, page_size=64)

# The competition's tuple interface: data = (q, kv_data, qo_indptr, kv_indptr, config).
data = generate_input(4, 1, 1024, seed=0, device=device)     # batch, q_len, kv_len, seed
out_ck = mla_decode.custom_kernel(data)                        # the fp8 cache by default

# Each against exact float64 math on the bf16 cache (the formats' own error included).
ref, _ = reference_decode(q, kv_cache.double(), qo_indptr, mla_decode.DEFAULT_SM_SCALE, kv_indptr=kv_indptr)
print(f"bf16  rel. error {rel_error(out, ref):.1e}")
print(f"fp8   rel. error {rel_error(out_fp8, ref):.1e}")
print(f"mxfp4 rel. error {rel_error(out_fp4, ref):.1e}  (paged, block 64)")
q2, kv_data, qo2, kvp2, config = data
ref2, _ = reference_decode(q2, dequantize_cache(kv_data["bf16"]), qo2, config["sm_scale"], kv_indptr=kvp2)
print(f"custom_kernel rel. error {rel_error(out_ck, ref2):.1e}")
print("plan of the bf16 call:", mla_decode.explain(q, kv_cache, qo_indptr, kv_indptr=kv_indptr))
assert rel_error(out, ref) < 8e-3 and rel_error(out_fp8, ref) < 0.05 and rel_error(out_fp4, ref) < 0.2
