"""A minimal DeepSeek-style decode step with absorbed MLA over a paged cache.

One attention layer of a DeepSeek-V2/V3-shaped model generating one token per
sequence: project the hidden state to queries and to the new latent KV entry,
append that entry to a paged cache (page size 64), absorb W_UK into the query
so attention runs in the 512-dim latent space over the shared 576-dim cache
rows (torch.ops.mla_decode.decode), then apply W_UV and W_O.

The step is run eagerly, under torch.compile(fullgraph=True), and on a GPU
also replayed as a CUDA graph; each result is compared with a float64
reference that does NOT absorb (it materialises per-head K and V), which is
the same function computed the other way round.

    python examples/deepseek_decode_step.py            # GPU if present, else CPU
"""

from __future__ import annotations

import math
import sys

import torch

import mla_decode  # noqa: F401  (registers torch.ops.mla_decode)

HIDDEN, HEADS, NOPE, ROPE, LORA, VDIM, PAGE = 1024, 16, 128, 64, 512, 128, 64


def rotary(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last dim (pairs (2i, 2i+1)) at positions pos (per row)."""
    half = x.shape[-1] // 2
    inv = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = pos.float()[:, None] * inv[None, :]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    cos, sin = ang.cos(), ang.sin()
    xe, xo = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], dim=-1).flatten(-2).to(x.dtype)


class Weights:
    def __init__(self, device, seed=0):
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)

        self.w_q = w(HIDDEN, HEADS * (NOPE + ROPE), scale=HIDDEN ** -0.5)
        self.w_kv_a = w(HIDDEN, LORA + ROPE, scale=HIDDEN ** -0.5)
        self.w_uk = w(HEADS, NOPE, LORA, scale=NOPE ** -0.5)   # latent -> per-head key (nope part)
        self.w_uv = w(HEADS, LORA, VDIM, scale=LORA ** -0.5)   # latent -> per-head value
        self.w_o = w(HEADS * VDIM, HIDDEN, scale=(HEADS * VDIM) ** -0.5)


def decode_step(x, pos, cache, block_table, cache_lens, W: Weights):
    """x: (B, HIDDEN) bf16; pos: (B,) int32 position of the new token (= tokens already cached).
    cache: (num_pages, PAGE, 1, 576) bf16, updated in place; cache_lens: (B,) int32 output lengths."""
    b = x.shape[0]
    q = (x @ W.w_q).view(b, HEADS, NOPE + ROPE)
    q_nope, q_rope = q[..., :NOPE], rotary(q[..., NOPE:], pos)
    kv = x @ W.w_kv_a                                   # (B, 576): latent c_kv and k_rope
    entry = torch.cat([kv[:, :LORA], rotary(kv[:, LORA:].unsqueeze(1), pos).squeeze(1)], dim=-1)
    # Append at (page, slot) of each sequence's position: no host sync.
    page_idx = torch.gather(block_table, 1, (pos // PAGE).long().unsqueeze(1)).squeeze(1)
    flat = cache.view(-1, LORA + ROPE)
    flat.index_copy_(0, (page_idx * PAGE + pos % PAGE).long(), entry)
    torch.add(pos, 1, out=cache_lens)
    # Absorb W_UK: q_latent[h] = q_nope[h] @ W_UK[h]  -> (B, H, 512)
    q_latent = torch.einsum("bhn,hnl->bhl", q_nope.float(), W.w_uk.float()).to(torch.bfloat16)
    q_full = torch.cat([q_latent, q_rope], dim=-1)      # (B, H, 576)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=x.device)
    o_latent, _ = torch.ops.mla_decode.decode(q_full, cache, None, qo_indptr, None, None, block_table, cache_lens,
                                              PAGE, 1.0 / math.sqrt(NOPE + ROPE), 0)
    v = torch.einsum("bhl,hlv->bhv", o_latent.float(), W.w_uv.float())
    return (v.reshape(b, HEADS * VDIM).to(torch.bfloat16) @ W.w_o)


def reference_step(x, pos, cache_rows, W: Weights):
    """Float64, non-absorbed: per-head K = [c_kv @ W_UK^T, k_rope], V = c_kv @ W_UV.
    cache_rows: list over the batch of (L_b, 576) tensors including the new token."""
    outs = []
    for i in range(x.shape[0]):
        xi = x[i:i + 1]
        q = (xi.double() @ W.w_q.double()).view(HEADS, NOPE + ROPE)
        q_nope = q[:, :NOPE]
        q_rope = rotary(q[:, NOPE:].to(torch.bfloat16).unsqueeze(0), pos[i:i + 1]).squeeze(0).double()
        rows = cache_rows[i].double()
        c, k_rope = rows[:, :LORA], rows[:, LORA:]
        k_nope = torch.einsum("tl,hnl->htn", c, W.w_uk.double())           # (H, L, 128)
        s = (torch.einsum("hn,htn->ht", q_nope, k_nope) + q_rope @ k_rope.T) / math.sqrt(NOPE + ROPE)
        p = torch.softmax(s, dim=-1)
        v = torch.einsum("tl,hlv->htv", c, W.w_uv.double())                # (H, L, 128)
        o = torch.einsum("ht,htv->hv", p, v).reshape(1, HEADS * VDIM)
        outs.append(o @ W.w_o.double())
    return torch.cat(outs)


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    W = Weights(device)
    lens = [150, 63, 1]                                  # tokens already cached per sequence
    b, pages_per_seq = len(lens), 4
    num_pages = b * pages_per_seq + 1
    cache = torch.randn(num_pages, PAGE, 1, LORA + ROPE, device=device).to(torch.bfloat16)
    perm = torch.randperm(num_pages - 1)[: b * pages_per_seq]
    block_table = perm.view(b, pages_per_seq).to(torch.int32).to(device)
    pos = torch.tensor(lens, dtype=torch.int32, device=device)
    x = (torch.randn(b, HIDDEN, device=device)).to(torch.bfloat16)
    cache_lens = torch.empty(b, dtype=torch.int32, device=device)

    def check(name, out, cache_now):
        flat = cache_now.view(-1, LORA + ROPE)
        rows = []
        for i, n in enumerate(lens):
            idx = [int(block_table[i, j // PAGE]) * PAGE + j % PAGE for j in range(n + 1)]
            rows.append(flat[idx].cpu())
        ref = reference_step(x.cpu(), pos.cpu(), rows, _cpu(W))
        rel = float((out.cpu().double() - ref).norm() / ref.norm())
        ok = rel < 2e-2  # bf16 activations and weights around an exact-math attention
        print(f"{name:<28} rel. error vs float64 non-absorbed reference: {rel:.2e}  {'ok' if ok else 'FAIL'}")
        return ok

    ok = True
    c0 = cache.clone()
    out = decode_step(x, pos, c0, block_table, cache_lens, W)
    ok &= check("eager", out, c0)

    compiled = torch.compile(decode_step, fullgraph=True, backend="inductor" if device.type == "cuda" else "aot_eager")
    c1 = cache.clone()
    out = compiled(x, pos, c1, block_table, cache_lens, W)
    ok &= check("torch.compile(fullgraph)", out, c1)

    if device.type == "cuda":
        c2 = cache.clone()
        static_out = None
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            decode_step(x, pos, c2.clone(), block_table, cache_lens, W)  # warm-up
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = decode_step(x, pos, c2, block_table, cache_lens, W)
        graph.replay()
        torch.cuda.synchronize()
        ok &= check("CUDA graph replay", static_out, c2)
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


def _cpu(W: Weights) -> Weights:
    out = Weights.__new__(Weights)
    for k, v in vars(W).items():
        setattr(out, k, v.cpu())
    return out


if __name__ == "__main__":
    sys.exit(main())
