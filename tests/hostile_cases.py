"""The hostile-input table: every malformed call a user can make, and its exact outcome.

Each case builds one operator call on a device ("cpu", "meta" or "cuda") and states what must
happen there:

  Raises(message)       the call raises (RuntimeError unless said otherwise) with a message
                        naming the argument, the expected and the actual value;
  Runs()                the input is valid, however unusual: the call runs and matches the
                        float64 reference (on meta: it runs and returns meta tensors);
  BadValues(message, nan_tokens)
                        a malformed index value: the CPU raises `message`; on the GPU the
                        call runs and exactly the query rows `nan_tokens` are NaN (every
                        head, out and lse), the others finite (the GPU's NaN contract,
                        csrc/common/addressing.h); the checked mode (checked=True, or
                        MLA_DECODE_CHECKED=1) raises the CPU's message on the GPU too;
                        meta tensors hold no values, so there the call runs.

A case's expectation applies on every device it lists unless `on` gives a device its own.
Messages may contain "{dev}" (q's device). On meta every tensor of the call is a meta tensor:
the fake kernels (mla_decode/_ops.py) must refuse what the real kernels refuse, with the
same message; where a check needs memory (pointer alignment, two tensors' overlap) the case
says what meta does instead.

tests/hostile_runner.py runs cases (in a subprocess, so that a crash or a hang is an outcome)
and evaluate() judges an outcome; tests/test_hostile.py drives it in batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from mla_decode.quant import quantize_fp8, quantize_mxfp4

SM = 1.0 / math.sqrt(576)
I32_MAX, I32_MIN = 2**31 - 1, -2**31
B, H, ROWS = 4, 16, 48          # base call: 4 items of one query token each, 16 heads, 48 cache rows
DEVICES = ("cpu", "meta", "cuda")


# ---- expectations -------------------------------------------------------------------------

@dataclass
class Raises:
    message: str
    error: str = "RuntimeError"


@dataclass
class Runs:
    pass


@dataclass
class BadValues:
    message: str
    nan_tokens: list


@dataclass
class Case:
    id: str
    build: Callable          # device -> call (dict)
    expect: object
    devices: tuple = DEVICES
    on: dict = field(default_factory=dict)  # device -> expectation overriding `expect`

    def expectation(self, device: str):
        exp = self.on.get(device, self.expect)
        if device == "meta" and isinstance(exp, BadValues):
            return Runs()
        return exp


# ---- the base calls -----------------------------------------------------------------------

def _t(values, dev):
    return torch.tensor(values, dtype=torch.int32).to(dev)


def _quantize(rows_bf16, fmt):
    kv = rows_bf16.unsqueeze(1)
    if fmt == "bf16":
        return kv.contiguous(), None
    if fmt == "fp8":
        return quantize_fp8(kv, torch.float8_e4m3fn)
    return quantize_mxfp4(kv)


def _poison(kv, scale, fmt, rows):
    """NaN in the format's encoding on the cache rows `rows` (never read by a correct kernel)."""
    flat = kv.reshape(ROWS, -1)
    if fmt == "bf16":
        flat[rows] = float("nan")
    elif fmt == "fp8":
        flat.view(torch.uint8)[rows] = 0x7F
    else:
        scale[rows] = 0xFF


def base(dev, layout="indptr", fmt="bf16", op="decode"):
    """A valid call: 4 items with 10, 10, 10, 10 keys (indptr / indices) or 10, 12, 5, 8 keys in
    pages of 8 (paged), one query token each, 16 heads; the cache rows no item reads are NaN."""
    g = torch.Generator().manual_seed(1234)
    q = torch.randn(B, H, 576, generator=g).to(torch.bfloat16)
    rows = torch.randn(ROWS, 576, generator=g).to(torch.bfloat16)
    kv, scale = _quantize(rows, fmt)
    a = dict(op=op, q=q, kv_cache=kv, kv_scale=scale, qo_indptr=_t([0, 1, 2, 3, 4], "cpu"), kv_indptr=None,
             kv_indices=None, block_table=None, kv_lens=None, page_size=1, sm_scale=SM, num_splits=0)
    used = torch.zeros(ROWS, dtype=torch.bool)
    if layout == "indptr":
        a["kv_indptr"] = _t([0, 10, 20, 30, 40], "cpu")
        used[:40] = True
    elif layout == "indices":
        a["kv_indptr"] = _t([0, 10, 20, 30, 40], "cpu")
        perm = torch.randperm(ROWS, generator=g)[:40].to(torch.int32)
        a["kv_indices"] = perm
        used[perm.long()] = True
    else:
        a["kv_cache"] = kv.view(ROWS // 8, 8, 1, kv.shape[-1])
        a["block_table"] = _t([[0, 1], [2, 3], [4, 0], [5, 1]], "cpu")
        a["kv_lens"] = _t([10, 12, 5, 8], "cpu")
        a["page_size"] = 8
        for b, n in enumerate([10, 12, 5, 8]):
            for j in range(n):
                used[int(a["block_table"][b, j // 8]) * 8 + j % 8] = True
    _poison(a["kv_cache"], scale, fmt, (~used).nonzero().flatten())
    if op in ("decode_out", "api_out"):
        a["out"] = torch.empty(B, H, 512, dtype=torch.bfloat16)
        a["lse"] = torch.empty(B, H, dtype=torch.float32)
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            a[k] = v.to(dev)
    return a


def _b(layout="indptr", fmt="bf16", op="decode"):
    return lambda dev: base(dev, layout, fmt, op)


def mutated(mutate, layout="indptr", fmt="bf16", op="decode"):
    def build(dev):
        a = base(dev, layout, fmt, op)
        mutate(a, dev)
        return a
    return build


def _set(**kw):
    """mutate: replace arguments; a callable value is applied to (args, dev)."""
    def mutate(a, dev):
        for k, v in kw.items():
            a[k] = v(a, dev) if callable(v) else v
    return mutate


def _idx(name, values):
    return _set(**{name: lambda a, dev: _t(values, dev)})


def _poke(name, index, value):
    """mutate: one entry of an index tensor."""
    def mutate(a, dev):
        t = a[name].clone()
        t[index] = value
        a[name] = t
    return mutate


CASES: list = []


def add(id, build, expect, devices=DEVICES, **on):
    assert all(c.id != id for c in CASES), id
    CASES.append(Case(id, build, expect, devices, on))


def view_of(t, shape, stride, offset=0):
    return t.as_strided(shape, stride, offset)


# ---- q ------------------------------------------------------------------------------------
add("q float32", mutated(_set(q=lambda a, d: a["q"].float())), Raises("q must be bfloat16, but it is Float"))
add("q float16", mutated(_set(q=lambda a, d: a["q"].half())), Raises("q must be bfloat16, but it is Half"))
add("q float8", mutated(_set(q=lambda a, d: a["q"].to(torch.float8_e4m3fn))),
    Raises("q must be bfloat16, but it is Float8_e4m3fn"))
add("q int8", mutated(_set(q=lambda a, d: torch.zeros(B, H, 576, dtype=torch.int8, device=d))),
    Raises("q must be bfloat16, but it is Char"))
add("q 2-D", mutated(_set(q=lambda a, d: a["q"][0])),
    Raises("q must be 3-D (total_q, num_heads, 576), but it has shape [16, 576]"))
add("q 4-D", mutated(_set(q=lambda a, d: a["q"].unsqueeze(0))),
    Raises("q must be 3-D (total_q, num_heads, 576), but it has shape [1, 4, 16, 576]"))
add("q head dim 512", mutated(_set(q=lambda a, d: a["q"][..., :512])),
    Raises("q's last dim must be 576 (kv_lora_rank 512 + rope 64), but it is 512"))
add("q head dim 577", mutated(_set(q=lambda a, d: torch.zeros(B, H, 577, dtype=torch.bfloat16, device=d))),
    Raises("q's last dim must be 576 (kv_lora_rank 512 + rope 64), but it is 577"))
add("q 0 heads", mutated(_set(q=lambda a, d: a["q"][:, :0])), Raises("q must have 1 to 128 heads, but it has 0"))
add("q 129 heads", mutated(_set(q=lambda a, d: torch.zeros(B, 129, 576, dtype=torch.bfloat16, device=d))),
    Raises("q must have 1 to 128 heads, but it has 129"))
add("q last dim strided", mutated(_set(q=lambda a, d: a["q"].repeat_interleave(2, -1)[..., ::2])),
    Raises("q's last dim must be contiguous (stride 1), but its stride is 2"))
add("q rows x heads past int32", mutated(_set(
    q=lambda a, d: torch.zeros(1, 1, 576, dtype=torch.bfloat16, device=d).expand(2**31 // 16 + 1, 16, 576))),
    Raises("q has 134217729 x 16 query rows, more than the int32 limit of 2147483647"))
add("q None", mutated(_set(q=None)), Raises("q must be a tensor, but it is undefined (None)"))
add("kv_cache None", mutated(_set(kv_cache=None)), Raises("kv_cache must be a tensor, but it is undefined (None)"))
add("qo_indptr None", mutated(_set(qo_indptr=None)), Raises("qo_indptr must be a tensor, but it is undefined (None)"))
add("q a list", mutated(_set(q=[1.0])),
    Raises("Expected a value of type 'Tensor' for argument 'q' but instead found type 'list'"))
# Valid q layouts: padded rows, head-major, read-only broadcast rows, strides of size-1 dims.
add("q padded rows", mutated(_set(q=lambda a, d: torch.cat([a["q"], a["q"][..., :64]], -1)[..., :576])), Runs())
add("q heads padded", mutated(_set(
    q=lambda a, d: torch.cat([a["q"], a["q"][:, :, :8]], -1).view(B, H, 584)[..., :576])), Runs())
add("q head-major", mutated(_set(q=lambda a, d: a["q"].transpose(0, 1).contiguous().transpose(0, 1))), Runs())
add("q broadcast over tokens", mutated(_set(q=lambda a, d: a["q"][:1].expand(B, H, 576))), Runs())
add("q one head, odd head stride", mutated(_set(q=lambda a, d: view_of(a["q"][:, :1].contiguous(), (B, 1, 576),
                                                                       (576, 7, 1)))), Runs())
add("q one token, odd token stride", mutated(_set(
    q=lambda a, d: view_of(a["q"][:1].contiguous(), (1, H, 576), (3, 576, 1)),
    qo_indptr=lambda a, d: _t([0, 1, 1, 1, 1], d))), Runs())
add("q no tokens", mutated(_set(q=lambda a, d: a["q"][:0], qo_indptr=lambda a, d: _t([0, 0, 0, 0, 0], d))), Runs())

# ---- kv_cache -----------------------------------------------------------------------------
add("cache float16", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].half())),
    Raises("kv_cache must be bfloat16, float8_e4m3fn, float8_e4m3fnuz, or uint8 / float4_e2m1fn_x2 (MXFP4), but "
           "it is Half"))
add("cache float32", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].float())),
    Raises("kv_cache must be bfloat16, float8_e4m3fn, float8_e4m3fnuz, or uint8 / float4_e2m1fn_x2 (MXFP4), but "
           "it is Float"))
add("cache int32", mutated(_set(kv_cache=lambda a, d: torch.zeros(ROWS, 1, 576, dtype=torch.int32, device=d))),
    Raises("or uint8 / float4_e2m1fn_x2 (MXFP4), but it is Int"))
add("cache float8_e5m2", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].to(torch.float8_e5m2),
                                      kv_scale=lambda a, d: torch.ones(1, device=d))),
    Raises("or uint8 / float4_e2m1fn_x2 (MXFP4), but it is Float8_e5m2"))
add("cache bool", mutated(_set(kv_cache=lambda a, d: torch.zeros(ROWS, 1, 576, dtype=torch.bool, device=d))),
    Raises("or uint8 / float4_e2m1fn_x2 (MXFP4), but it is Bool"))
add("cache 1-D", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].reshape(-1))),
    Raises("kv_cache must be 2-D (rows, D), 3-D (rows, 1, D) or (pages, page_size, D), or 4-D (pages, page_size, "
           "1, D), but it has shape [27648]"))
add("cache 5-D", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].view(ROWS, 1, 1, 1, 576))),
    Raises("but it has shape [48, 1, 1, 1, 576]"))
add("cache head dim 512", mutated(_set(kv_cache=lambda a, d: a["kv_cache"][..., :512])),
    Raises("a bfloat16 kv_cache must have 576 elements per row (last dim), but it has 512"))
add("cache bytes of 576", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].view(torch.uint8)[..., :576],
                                       kv_scale=lambda a, d: torch.zeros(ROWS, 18, dtype=torch.uint8, device=d))),
    Raises("a mxfp4 kv_cache must have 288 elements per row (last dim), but it has 576"))
add("cache last dim strided", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].repeat_interleave(2, -1)[..., ::2])),
    Raises("kv_cache's last dim must be contiguous (stride 1), but its stride is 2"))
add("cache rows overlap", mutated(_set(kv_cache=lambda a, d: a["kv_cache"][:1].expand(ROWS, 1, 576))),
    Raises("kv_cache rows overlap (row stride 0 < 576 elements per row)"))
add("cache rows overlap partly", mutated(_set(
    kv_cache=lambda a, d: view_of(a["kv_cache"], (ROWS - 1, 576), (575, 1)))),
    Raises("kv_cache rows overlap (row stride 575 < 576 elements per row)"))
add("cache 4-D two heads", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].view(ROWS // 2, 1, 2, 576))),
    Raises("a 4-D kv_cache must be (pages, page_size, 1, D) with one KV head, but dim 2 is 2"))
add("paged cache without table", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].view(6, 8, 576))),
    Raises("kv_cache of shape [6, 8, 576] is paged (pages, page_size, ...) but no block_table was given"))
add("cache rows past int32", mutated(_set(
    kv_cache=lambda a, d: torch.empty(2**31, 576, dtype=torch.bfloat16, device=d))),
    Raises("kv_cache has 2147483648 token rows, more than the int32 index limit of 2147483647"), devices=("meta",))
add("paged cache rows past int32", mutated(_set(
    kv_cache=lambda a, d: torch.empty(2**28, 8, 1, 576, dtype=torch.bfloat16, device=d),
    block_table=lambda a, d: _t([[0, 1]] * 4, d), kv_lens=lambda a, d: _t([1] * 4, d), kv_indptr=None, page_size=8)),
    Raises("kv_cache has 2147483648 token rows, more than the int32 index limit"), devices=("meta",))
# Valid cache layouts: padded rows, a storage offset, (rows, 1, 1, D), float4 codes, fp8 / MXFP4.
add("cache padded rows", mutated(_set(
    kv_cache=lambda a, d: torch.cat([a["kv_cache"], a["kv_cache"][..., :24]], -1)[..., :576])), Runs())
add("cache row stride 577", mutated(_set(
    kv_cache=lambda a, d: torch.cat([a["kv_cache"], a["kv_cache"][..., :1]], -1)[..., :576])), Runs(),
    cuda=Raises("on the GPU, kv_cache rows must start on 16-byte boundaries, but the row stride is 1154 bytes"))
add("cache storage offset", mutated(_set(
    kv_cache=lambda a, d: torch.cat([a["kv_cache"].reshape(-1)[:8], a["kv_cache"].reshape(-1)])[8:].view(ROWS, 576))),
    Runs())
add("cache misaligned start", mutated(_set(
    kv_cache=lambda a, d: torch.cat([a["kv_cache"].reshape(-1)[:1], a["kv_cache"].reshape(-1)])[1:].view(ROWS, 576))),
    Runs(), cuda=Raises("kv_cache rows must start on 16-byte boundaries, but the row stride is 1152 bytes and the "
                        "data pointer is 2 bytes past a boundary"))
add("cache rows 1 1 576 with kv_indptr", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].view(ROWS, 1, 1, 576))),
    Runs())
add("cache one row, any stride", mutated(_set(
    kv_cache=lambda a, d: view_of(a["kv_cache"], (1, 576), (3, 1)),
    kv_indptr=lambda a, d: _t([0, 1, 1, 1, 1], d))), Runs())
add("cache empty", mutated(_set(kv_cache=lambda a, d: a["kv_cache"][:0],
                                kv_indptr=lambda a, d: _t([0, 0, 0, 0, 0], d))), Runs())
add("fp8 cache", _b(fmt="fp8"), Runs())
add("mxfp4 cache", _b(fmt="mxfp4"), Runs())
add("mxfp4 float4 codes", mutated(_set(kv_cache=lambda a, d: a["kv_cache"].view(torch.float4_e2m1fn_x2)),
                                  fmt="mxfp4"), Runs())
add("mxfp4 e8m0 scales", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].view(torch.float8_e8m0fnu)),
                                 fmt="mxfp4"), Runs())

# ---- kv_scale -----------------------------------------------------------------------------
add("bf16 with scale", mutated(_set(kv_scale=lambda a, d: torch.ones(1, device=d))),
    Raises("kv_scale must be None for a bfloat16 kv_cache"))
add("fp8 without scale", mutated(_set(kv_scale=None), fmt="fp8"),
    Raises("an fp8 kv_cache needs kv_scale, a float32 tensor of shape (1,)"))
add("fp8 scale float64", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].double()), fmt="fp8"),
    Raises("fp8 kv_scale must be float32, but it is Double"))
add("fp8 scale bfloat16", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].bfloat16()), fmt="fp8"),
    Raises("fp8 kv_scale must be float32, but it is BFloat16"))
add("fp8 scale of two", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].repeat(2)), fmt="fp8"),
    Raises("fp8 kv_scale must hold one value (per-tensor scale), but it has shape [2]"))
add("fp8 scale empty", mutated(_set(kv_scale=lambda a, d: a["kv_scale"][:0]), fmt="fp8"),
    Raises("fp8 kv_scale must hold one value (per-tensor scale), but it has shape [0]"))
add("fp8 scale 0-D", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].reshape(())), fmt="fp8"), Runs())
add("fp8 scale 1x1", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].reshape(1, 1)), fmt="fp8"), Runs())
add("mxfp4 without scale", mutated(_set(kv_scale=None), fmt="mxfp4"),
    Raises("an MXFP4 kv_cache needs kv_scale, the E8M0 block scales (rows >= 48, columns >= 18)"))
add("mxfp4 scale int32", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].int()), fmt="mxfp4"),
    Raises("MXFP4 kv_scale must be uint8 or float8_e8m0fnu, but it is Int"))
add("mxfp4 scale float32", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].float()), fmt="mxfp4"),
    Raises("MXFP4 kv_scale must be uint8 or float8_e8m0fnu, but it is Float"))
add("mxfp4 scale 1-D", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].reshape(-1)), fmt="mxfp4"),
    Raises("MXFP4 kv_scale must be 2-D (rows, blocks), but it has shape [864]"))
add("mxfp4 scale 3-D", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].view(ROWS, 1, 18)), fmt="mxfp4"),
    Raises("MXFP4 kv_scale must be 2-D (rows, blocks), but it has shape [48, 1, 18]"))
add("mxfp4 scale rows short", mutated(_set(kv_scale=lambda a, d: a["kv_scale"][:47]), fmt="mxfp4"),
    Raises("MXFP4 kv_scale must have at least 48 rows and 18 columns, but it has shape [47, 18]"))
add("mxfp4 scale cols short", mutated(_set(kv_scale=lambda a, d: a["kv_scale"][:, :17]), fmt="mxfp4"),
    Raises("MXFP4 kv_scale must have at least 48 rows and 18 columns, but it has shape [48, 17]"))
add("mxfp4 scale padded", mutated(_set(
    kv_scale=lambda a, d: torch.cat([a["kv_scale"], a["kv_scale"][:, :6]], 1)[:, :18]), fmt="mxfp4"), Runs())
add("mxfp4 scale column-major", mutated(_set(kv_scale=lambda a, d: a["kv_scale"].t().contiguous().t()),
                                        fmt="mxfp4"), Runs())
add("mxfp4 scale extra rows", mutated(_set(
    kv_scale=lambda a, d: torch.cat([a["kv_scale"], a["kv_scale"]], 0)), fmt="mxfp4"), Runs())

# ---- qo_indptr and the lengths of the index tensors -----------------------------------------
add("qo_indptr int64", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"].long())),
    Raises("qo_indptr must be int32, but it is Long"))
add("qo_indptr float", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"].float())),
    Raises("qo_indptr must be int32, but it is Float"))
add("qo_indptr 2-D", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"].view(1, 5))),
    Raises("qo_indptr must be 1-D, but it has shape [1, 5]"))
add("qo_indptr 0-D", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"][0])),
    Raises("qo_indptr must be 1-D, but it has shape []"))
add("qo_indptr strided", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"].repeat_interleave(2)[::2])),
    Raises("qo_indptr must be contiguous, but its stride is 2"))
add("qo_indptr one entry", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"][:1])),
    Raises("qo_indptr must have batch_size + 1 >= 2 entries, but it has 1"))
add("qo_indptr empty", mutated(_set(qo_indptr=lambda a, d: a["qo_indptr"][:0])),
    Raises("qo_indptr must have batch_size + 1 >= 2 entries, but it has 0"))
add("qo_indptr one entry too long", mutated(_idx("qo_indptr", [0, 1, 2, 3, 4, 4])),
    Raises("qo_indptr and kv_indptr must have the same length, batch_size + 1, but qo_indptr has 6 entries "
           "(batch_size 5) and kv_indptr has 5 (batch_size 4)"))
add("qo_indptr past int32 entries", mutated(_set(qo_indptr=lambda a, d: torch.empty(2**31 + 2, dtype=torch.int32,
                                                                                    device=d))),
    Raises("qo_indptr has 2147483650 entries, a batch of 2147483649 items, more than the int32 limit of 2147483647"),
    devices=("meta",))
add("kv_indptr one entry short", mutated(_set(kv_indptr=lambda a, d: a["kv_indptr"][:4])),
    Raises("qo_indptr and kv_indptr must have the same length, batch_size + 1, but qo_indptr has 5 entries "
           "(batch_size 4) and kv_indptr has 4 (batch_size 3)"))
add("kv_indptr int64", mutated(_set(kv_indptr=lambda a, d: a["kv_indptr"].long())),
    Raises("kv_indptr must be int32, but it is Long"))
add("kv_indptr 2-D", mutated(_set(kv_indptr=lambda a, d: a["kv_indptr"].view(5, 1))),
    Raises("kv_indptr must be 1-D, but it has shape [5, 1]"))
add("kv_indptr strided", mutated(_set(kv_indptr=lambda a, d: a["kv_indptr"].repeat_interleave(2)[::2])),
    Raises("kv_indptr must be contiguous, but its stride is 2"))
add("kv_indices int64", mutated(_set(kv_indices=lambda a, d: a["kv_indices"].long()), layout="indices"),
    Raises("kv_indices must be int32, but it is Long"))
add("kv_indices 2-D", mutated(_set(kv_indices=lambda a, d: a["kv_indices"].view(4, 10)), layout="indices"),
    Raises("kv_indices must be 1-D, but it has shape [4, 10]"))
add("kv_indices strided", mutated(_set(kv_indices=lambda a, d: a["kv_indices"].repeat_interleave(2)[::2]),
                                  layout="indices"), Raises("kv_indices must be contiguous, but its stride is 2"))
add("kv_indices longer than used", mutated(_set(kv_indices=lambda a, d: torch.cat([a["kv_indices"]] * 2)),
                                           layout="indices"), Runs())
add("kv_indices huge", mutated(_set(kv_indices=lambda a, d: torch.empty(2**33, dtype=torch.int32, device=d)),
                               layout="indices"), Runs(), devices=("meta",))

# ---- layout ---------------------------------------------------------------------------------
add("no addressing", mutated(_set(kv_indptr=None)),
    Raises("neither kv_indptr nor block_table was given; pass kv_indptr (batch_size + 1 int32) or block_table "
           "with kv_lens"))
add("indices without indptr", mutated(_set(kv_indptr=None), layout="indices"),
    Raises("neither kv_indptr nor block_table was given"))
add("kv_lens without table", mutated(_set(kv_lens=lambda a, d: _t([10] * 4, d))),
    Raises("kv_lens is only used with block_table; with kv_indptr the lengths are kv_indptr[b+1] - kv_indptr[b]"))
add("page size with indptr", mutated(_set(page_size=16)),
    Raises("page_size must be 1 with kv_indptr (rows are tokens), but it is 16"))
add("table without kv_lens", mutated(_set(kv_lens=None), layout="paged"),
    Raises("block_table was given without kv_lens; the paged layout needs both"))
add("table and kv_indptr", mutated(_set(kv_indptr=lambda a, d: _t([0] * 5, d)), layout="paged"),
    Raises("give either kv_indptr (with optional kv_indices) or block_table with kv_lens, not both"))
add("table and kv_indices", mutated(_set(kv_indices=lambda a, d: _t([0] * 5, d)), layout="paged"),
    Raises("give either kv_indptr (with optional kv_indices) or block_table with kv_lens, not both"))
add("page size 0", mutated(_set(page_size=0), layout="paged"), Raises("page_size must be in [1, 65536], but it is 0"))
add("page size -1", mutated(_set(page_size=-1), layout="paged"),
    Raises("page_size must be in [1, 65536], but it is -1"))
add("page size 65537", mutated(_set(page_size=65537), layout="paged"),
    Raises("page_size must be in [1, 65536], but it is 65537"))
add("page size 2^40", mutated(_set(page_size=2**40), layout="paged"),
    Raises("page_size must be in [1, 65536], but it is 1099511627776"))
add("page dim mismatch", mutated(_set(page_size=4), layout="paged"),
    Raises("kv_cache's dim 1 is the page size (4), but it is 8"))
add("pages unevenly strided", mutated(_set(
    kv_cache=lambda a, d: torch.cat([a["kv_cache"], a["kv_cache"][:, :1]], 1)[:, :8]), layout="paged"),
    Raises("kv_cache pages must be evenly strided token rows (page stride = page_size x row stride = 4608), but "
           "the page stride is 5184"))
add("pages interleaved", mutated(_set(
    kv_cache=lambda a, d: a["kv_cache"].view(8, 6, 1, 576).transpose(0, 1)), layout="paged"),
    Raises("kv_cache pages must be evenly strided token rows (page stride = page_size x row stride = 27648), but "
           "the page stride is 576"))
add("table int64", mutated(_set(block_table=lambda a, d: a["block_table"].long()), layout="paged"),
    Raises("block_table must be int32, but it is Long"))
add("table 1-D", mutated(_set(block_table=lambda a, d: a["block_table"].reshape(-1)), layout="paged"),
    Raises("block_table must be 2-D (batch_size, max_pages), but it has shape [8]"))
add("table 3-D", mutated(_set(block_table=lambda a, d: a["block_table"].view(4, 2, 1)), layout="paged"),
    Raises("block_table must be 2-D (batch_size, max_pages), but it has shape [4, 2, 1]"))
add("table rows", mutated(_set(block_table=lambda a, d: a["block_table"][:3]), layout="paged"),
    Raises("block_table must have one row per item, batch_size = 4 (qo_indptr has 5 entries), but it has shape "
           "[3, 2]"))
add("table columns strided", mutated(_set(block_table=lambda a, d: a["block_table"].repeat_interleave(2, 1)[:, ::2]),
                                     layout="paged"),
    Raises("block_table rows must be contiguous, but its column stride is 2"))
add("table rows padded", mutated(_set(block_table=lambda a, d: torch.cat([a["block_table"]] * 2, 1)[:, :2]),
                                 layout="paged"), Runs())
add("table covers past int32", mutated(_set(
    kv_cache=lambda a, d: torch.zeros(2, 1, 576, dtype=torch.bfloat16, device=d).view(2, 1, 1, 576)
    .expand(2, 65536, 1, 576), block_table=lambda a, d: torch.zeros(4, 32768, dtype=torch.int32, device=d),
    page_size=65536), layout="paged"),
    Raises("block_table's 32768 pages of 65536 tokens cover 2147483648 tokens per item, more than the int32 limit "
           "of 2147483647"))
add("kv_lens int64", mutated(_set(kv_lens=lambda a, d: a["kv_lens"].long()), layout="paged"),
    Raises("kv_lens must be int32, but it is Long"))
add("kv_lens 2-D", mutated(_set(kv_lens=lambda a, d: a["kv_lens"].view(4, 1)), layout="paged"),
    Raises("kv_lens must be 1-D, but it has shape [4, 1]"))
add("kv_lens one short", mutated(_set(kv_lens=lambda a, d: a["kv_lens"][:3]), layout="paged"),
    Raises("kv_lens must have batch_size entries and qo_indptr batch_size + 1, but qo_indptr has 5 entries "
           "(batch_size 4) and kv_lens has 3"))
add("kv_lens strided", mutated(_set(kv_lens=lambda a, d: a["kv_lens"].repeat_interleave(2)[::2]), layout="paged"),
    Raises("kv_lens must be contiguous, but its stride is 2"))
add("paged fp8", _b("paged", "fp8"), Runs())
add("paged mxfp4", _b("paged", "mxfp4"), Runs())
add("indices mxfp4", _b("indices", "mxfp4"), Runs())
add("table entries past kv_lens are not read", mutated(_poke("block_table", (2, 1), -5), layout="paged"), Runs())
add("paged (pages, 1, 1, 576) padded rows", lambda dev: _pages_of_one(dev, padded_view="slice"), Runs())
add("paged (pages, 1, 1, 576) padded rows other view", lambda dev: _pages_of_one(dev, padded_view="view"), Runs())
add("paged (pages, 1, 576) padded rows", lambda dev: _pages_of_one(dev, padded_view="3-D"), Runs())
add("paged one item, odd size-1 strides", lambda dev: _one_item_odd_strides(dev), Runs())


def _pages_of_one(dev, padded_view):
    """A cache of 8 pages of one token, rows padded to 608 elements, at page size 1."""
    g = torch.Generator().manual_seed(7)
    buf = torch.randn(8, 608, generator=g).to(torch.bfloat16).to(dev)
    if padded_view == "slice":
        kv = buf[:, :576].view(8, 1, 1, 576)          # strides (608, 576, 576, 1)
    elif padded_view == "view":
        kv = buf.view(8, 1, 1, 608)[..., :576]         # strides (608, 608, 608, 1)
    else:
        kv = buf[:, :576].view(8, 1, 576)
    q = torch.randn(2, H, 576, generator=g).to(torch.bfloat16).to(dev)
    return dict(op="decode", q=q, kv_cache=kv, kv_scale=None, qo_indptr=_t([0, 1, 2], dev), kv_indptr=None,
                kv_indices=None, block_table=_t([[3, 1, 2], [7, 0, 0]], dev), kv_lens=_t([3, 1], dev), page_size=1,
                sm_scale=SM, num_splits=0)


def _one_item_odd_strides(dev):
    """One item: block_table (1, P) and kv_lens (1,) whose size-1 dims have arbitrary strides."""
    a = base(dev, "paged")
    a["q"] = a["q"][:1]
    a["qo_indptr"] = _t([0, 1], dev)
    a["block_table"] = view_of(_t([0, 1, 9, 9], dev), (1, 2), (12345, 1))
    a["kv_lens"] = view_of(_t([10, 9, 9], dev), (1,), (3,))
    return a


# ---- scalars ----------------------------------------------------------------------------------
add("sm_scale nan", mutated(_set(sm_scale=float("nan"))),
    Raises("sm_scale must be finite and nonzero in float32, but it is nan"))
add("sm_scale inf", mutated(_set(sm_scale=float("inf"))),
    Raises("sm_scale must be finite and nonzero in float32, but it is inf"))
add("sm_scale 0", mutated(_set(sm_scale=0.0)), Raises("sm_scale must be finite and nonzero in float32, but it is 0"))
add("sm_scale beyond float32", mutated(_set(sm_scale=1e300)),
    Raises("sm_scale must be finite and nonzero in float32, but it is 1e+300"))
add("sm_scale below float32", mutated(_set(sm_scale=1e-300)),
    Raises("sm_scale must be finite and nonzero in float32, but it is 1e-300"))
add("sm_scale negative", mutated(_set(sm_scale=-SM)), Runs())
add("num_splits -1", mutated(_set(num_splits=-1)), Raises("num_splits must be in [0, 256] (0 = automatic), but it is -1"))
add("num_splits 257", mutated(_set(num_splits=257)),
    Raises("num_splits must be in [0, 256] (0 = automatic), but it is 257"))
add("num_splits 2^40", mutated(_set(num_splits=2**40)),
    Raises("num_splits must be in [0, 256] (0 = automatic), but it is 1099511627776"))
add("num_splits 256", mutated(_set(num_splits=256)), Runs())

# ---- outputs (decode_out) ------------------------------------------------------------------------
OUT = dict(op="decode_out")
add("out float32", mutated(_set(out=lambda a, d: a["out"].float()), **OUT), Raises("out must be bfloat16, but it is Float"))
add("out shape", mutated(_set(out=lambda a, d: a["out"][:, :8]), **OUT),
    Raises("out must have shape (4, 16, 512), but it has shape [4, 8, 512]"))
add("out 2-D", mutated(_set(out=lambda a, d: a["out"].view(B * H, 512)), **OUT),
    Raises("out must have shape (4, 16, 512), but it has shape [64, 512]"))
add("out last dim strided", mutated(_set(
    out=lambda a, d: torch.empty(B, H, 1024, dtype=torch.bfloat16, device=d)[..., ::2]), **OUT),
    Raises("out's last dim must be contiguous, but its stride is 2"))
add("lse float64", mutated(_set(lse=lambda a, d: a["lse"].double()), **OUT), Raises("lse must be float32, but it is Double"))
add("lse shape", mutated(_set(lse=lambda a, d: a["lse"][:3]), **OUT),
    Raises("lse must have shape (4, 16), but it has shape [3, 16]"))
add("out overlaps itself", mutated(_set(
    out=lambda a, d: torch.zeros(1, H, 512, dtype=torch.bfloat16, device=d).expand(B, H, 512)), **OUT),
    Raises("out's elements must not overlap in memory, but its strides [0, 512, 1] (shape [4, 16, 512]) map several "
           "of them to one address"))
add("out heads overlap", mutated(_set(
    out=lambda a, d: view_of(torch.empty(B * H * 512, dtype=torch.bfloat16, device=d), (B, H, 512), (H * 512, 256, 1))),
    **OUT), Raises("out's elements must not overlap in memory, but its strides [8192, 256, 1] (shape [4, 16, 512])"))
add("lse overlaps itself", mutated(_set(lse=lambda a, d: torch.zeros(B, 1, device=d).expand(B, H)), **OUT),
    Raises("lse's elements must not overlap in memory, but its strides [1, 0] (shape [4, 16])"))
add("out overlaps lse", lambda dev: _shared_outputs(dev, apart=False), Raises(
    "out must not overlap lse in memory, but it does: out spans bytes 0..65535 of their storage and lse bytes "
    "256..511"), meta=Runs())
add("out and lse apart in one buffer", lambda dev: _shared_outputs(dev, apart=True), Runs())
add("out overlaps q", mutated(_set(out=lambda a, d: a["q"][..., :512]), **OUT),
    Raises("out must not overlap q in memory, but it does"), meta=Runs())
add("lse overlaps kv_cache", mutated(_set(
    lse=lambda a, d: a["kv_cache"].view(torch.float32).reshape(-1)[:B * H].view(B, H)), **OUT),
    Raises("lse must not overlap kv_cache in memory, but it does"), meta=Runs())
add("lse overlaps kv_scale", lambda dev: _out_over_scale(dev),
    Raises("lse must not overlap kv_scale in memory, but it does"), meta=Runs())
add("out padded", mutated(_set(
    out=lambda a, d: torch.empty(B, H, 520, dtype=torch.bfloat16, device=d)[..., :512]), **OUT), Runs())
add("out head-major", mutated(_set(
    out=lambda a, d: torch.empty(H, B, 512, dtype=torch.bfloat16, device=d).transpose(0, 1)), **OUT), Runs())
add("lse transposed", mutated(_set(lse=lambda a, d: torch.empty(H, B, device=d).t()), **OUT), Runs())
add("out one row, odd size-1 strides", lambda dev: _one_row_outputs(dev), Runs())
# The GPU kernels store out in groups of up to four bf16 values: its rows must be 8-byte aligned there
# (the CPU takes any alignment); rows 8 bytes past a 16-byte boundary run on every device.
add("out rows 2 bytes past 8-byte alignment", mutated(_set(
    out=lambda a, d: torch.empty(B * H * 512 + 4, dtype=torch.bfloat16, device=d)[1:1 + B * H * 512].view(B, H, 512)),
    **OUT), Runs(), cuda=Raises("out's rows must start at 8-byte aligned addresses (an element offset and strides "
                                "that are multiples of 4), but out starts 2 bytes past an 8-byte boundary"))
add("out head stride 514", mutated(_set(
    out=lambda a, d: torch.empty(B, H, 514, dtype=torch.bfloat16, device=d)[..., :512]), **OUT),
    Runs(), cuda=Raises("out starts 0 bytes past an 8-byte boundary with strides [8224, 514, 1]"))
add("out rows 8 bytes past 16-byte alignment", mutated(_set(
    out=lambda a, d: torch.empty(B * H * 512 + 4, dtype=torch.bfloat16, device=d)[4:4 + B * H * 512].view(B, H, 512)),
    **OUT), Runs())


def _shared_outputs(dev, apart):
    """out and lse carved out of one byte buffer: overlapping, or disjoint."""
    a = base(dev, op="decode_out")
    buf = torch.empty(B * H * 512 * 2 + B * H * 4 + 64, dtype=torch.uint8, device=dev)
    a["out"] = buf[:B * H * 512 * 2].view(torch.bfloat16).view(B, H, 512)
    start = B * H * 512 * 2 + 64 if apart else 256
    a["lse"] = buf[start:start + B * H * 4].view(torch.float32).view(B, H)
    return a


def _out_over_scale(dev):
    a = base(dev, fmt="fp8", op="decode_out")
    buf = torch.ones(B * H + 1, device=dev)
    a["kv_scale"] = buf[:1]
    a["lse"] = buf[:B * H].view(B, H)
    return a


def _one_row_outputs(dev):
    a = base(dev, op="decode_out")
    a["q"] = a["q"][:1, :1]
    a["qo_indptr"] = _t([0, 1, 1, 1, 1], dev)
    a["out"] = view_of(torch.empty(512, dtype=torch.bfloat16, device=dev), (1, 1, 512), (7, 3, 1))
    a["lse"] = view_of(torch.empty(1, device=dev), (1, 1), (5, 9))
    return a


# ---- devices ----------------------------------------------------------------------------------------
# On the CPU machine: one meta tensor among CPU tensors (the fake kernel runs and must refuse it).
# On a GPU: one CPU tensor among CUDA tensors (the CUDA kernel runs and must name it).
MIX = ("cpu", "cuda")
_OTHER = {"cpu": "meta", "cuda": "cpu", "meta": "meta"}


def _moved(name, layout="indptr", fmt="bf16", op="decode"):
    def mutate(a, dev):
        a[name] = a[name].to(_OTHER[dev])
    return mutated(mutate, layout, fmt, op)


def _where(dev):
    return _OTHER[dev]


add("device kv_cache", _moved("kv_cache"), Raises("kv_cache must be on the same device as q ({dev}), but it is on "
                                                   "{other}"), devices=MIX)
add("device q", _moved("q"), Raises("kv_cache must be on the same device as q ({other}), but it is on {dev}"),
    devices=MIX)
add("device qo_indptr", _moved("qo_indptr"), Raises("qo_indptr must be on the same device as q ({dev}), but it is on "
                                                     "{other}"), devices=MIX)
add("device kv_indptr", _moved("kv_indptr"), Raises("kv_indptr must be on the same device as q ({dev}), but it is "
                                                     "on {other}"), devices=MIX)
add("device kv_indices", _moved("kv_indices", "indices"),
    Raises("kv_indices must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)
add("device block_table", _moved("block_table", "paged"),
    Raises("block_table must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)
add("device kv_lens", _moved("kv_lens", "paged"),
    Raises("kv_lens must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)
add("device fp8 scale", _moved("kv_scale", fmt="fp8"),
    Raises("kv_scale must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)
add("device mxfp4 scale", _moved("kv_scale", fmt="mxfp4"),
    Raises("kv_scale must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)
add("device out", _moved("out", op="decode_out"),
    Raises("out must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)
add("device lse", _moved("lse", op="decode_out"),
    Raises("lse must be on the same device as q ({dev}), but it is on {other}"), devices=MIX)

# ---- autograd -----------------------------------------------------------------------------------------
add("backward through decode", mutated(_set(op="backward", q=lambda a, d: a["q"].float().requires_grad_())),
    Raises("mla_decode.decode is not differentiable: it is an inference kernel with no backward"),
    devices=("cpu", "cuda"))
add("decode_out with q requiring grad", mutated(_set(op="decode_out_grad"), op="decode_out"),
    Raises("mla_decode.decode_out is not differentiable, but q requires grad"), devices=("cpu", "cuda"))
add("decode under no_grad", mutated(_set(op="no_grad")), Runs(), devices=("cpu", "cuda"))

# ---- index values ----------------------------------------------------------------------------------------
# Base: qo_indptr [0, 1, 2, 3, 4] (4 tokens), kv_indptr [0, 10, 20, 30, 40] over 48 rows; paged:
# kv_lens [10, 12, 5, 8], block_table [[0, 1], [2, 3], [4, 0], [5, 1]], 6 pages of 8.
V = BadValues
add("qo_indptr starts at 1", mutated(_idx("qo_indptr", [1, 1, 2, 3, 4])), V("qo_indptr[0] must be 0, but it is 1", [0]))
add("qo_indptr starts at -1", mutated(_idx("qo_indptr", [-1, 1, 2, 3, 4])),
    V("qo_indptr[0] must be 0, but it is -1", [0]))
add("qo_indptr decreasing", mutated(_idx("qo_indptr", [0, 2, 1, 3, 4])),
    V("qo_indptr must be non-decreasing, but qo_indptr[2] = 1 < qo_indptr[1] = 2", [0, 1, 2]))
add("qo_indptr past q", mutated(_idx("qo_indptr", [0, 1, 2, 3, 5])),
    V("qo_indptr[-1] must equal q.size(0) = 4, but it is 5", [3]))
add("qo_indptr short of q", mutated(_idx("qo_indptr", [0, 1, 2, 3, 3])),
    V("qo_indptr[-1] must equal q.size(0) = 4, but it is 3", [3]))
add("qo_indptr int32 max inside", mutated(_idx("qo_indptr", [0, 1, 2, I32_MAX, 4])),
    V("qo_indptr must be non-decreasing, but qo_indptr[4] = 4 < qo_indptr[3] = 2147483647", [2, 3]))
add("qo_indptr int32 min inside", mutated(_idx("qo_indptr", [0, 1, I32_MIN, 3, 4])),
    V("qo_indptr must be non-decreasing, but qo_indptr[2] = -2147483648 < qo_indptr[1] = 1", [0, 1, 2]))
add("qo_indptr all int32 max", mutated(_idx("qo_indptr", [0, I32_MAX, I32_MAX, I32_MAX, I32_MAX])),
    V("qo_indptr[-1] must equal q.size(0) = 4, but it is 2147483647", [0, 1, 2, 3]))
add("kv_indptr starts at -1", mutated(_idx("kv_indptr", [-1, 10, 20, 30, 40])),
    V("kv_indptr[0] must be >= 0, but it is -1", [0]))
add("kv_indptr decreasing", mutated(_idx("kv_indptr", [0, 10, 5, 30, 40])),
    V("kv_indptr must be non-decreasing, but kv_indptr[2] = 5 < kv_indptr[1] = 10", [0, 1, 2]))
add("kv_indptr past the cache", mutated(_idx("kv_indptr", [0, 10, 20, 30, 49])),
    V("kv_indptr[-1] = 49 exceeds the kv_cache's 48 rows", [3]))
add("kv_indptr int32 max end", mutated(_idx("kv_indptr", [0, 10, 20, 30, I32_MAX])),
    V("kv_indptr[-1] = 2147483647 exceeds the kv_cache's 48 rows", [3]))
add("kv_indptr int32 min and max", mutated(_idx("kv_indptr", [I32_MIN, 10, 20, 30, I32_MAX])),
    V("kv_indptr[0] must be >= 0, but it is -2147483648", [0, 3]))
add("kv_indptr int32 max inside", mutated(_idx("kv_indptr", [0, 10, I32_MAX, 30, 40])),
    V("kv_indptr must be non-decreasing, but kv_indptr[3] = 30 < kv_indptr[2] = 2147483647", [1, 2, 3]))
add("kv_indices past kv_indptr's end", mutated(_idx("kv_indptr", [0, 10, 20, 30, 41]), layout="indices"),
    V("kv_indptr[-1] = 41 exceeds the length of kv_indices (40)", [3]))
add("kv_indices too short", mutated(_set(kv_indices=lambda a, d: a["kv_indices"][:35]), layout="indices"),
    V("kv_indptr[-1] = 40 exceeds the length of kv_indices (35)", [3]))
add("kv_indptr decreasing with indices", mutated(_idx("kv_indptr", [0, 10, 20, 15, 40]), layout="indices"),
    V("kv_indptr must be non-decreasing, but kv_indptr[3] = 15 < kv_indptr[2] = 20", [1, 2, 3]))
add("kv_indices negative", mutated(_poke("kv_indices", 15, -1), layout="indices"),
    V("kv_indices[15] = -1 is not a row of kv_cache (48 rows)", [1]))
add("kv_indices past the cache", mutated(_poke("kv_indices", 35, 48), layout="indices"),
    V("kv_indices[35] = 48 is not a row of kv_cache (48 rows)", [3]))
add("kv_indices int32 min", mutated(_poke("kv_indices", 0, I32_MIN), layout="indices"),
    V("kv_indices[0] = -2147483648 is not a row of kv_cache (48 rows)", [0]))
add("kv_indices int32 max", mutated(_poke("kv_indices", 25, I32_MAX), layout="indices"),
    V("kv_indices[25] = 2147483647 is not a row of kv_cache (48 rows)", [2]))
add("kv_lens negative", mutated(_poke("kv_lens", 1, -1), layout="paged"),
    V("kv_lens[1] = -1 must be in [0, max_pages x page_size = 16]", [1]))
add("kv_lens int32 min", mutated(_poke("kv_lens", 1, I32_MIN), layout="paged"),
    V("kv_lens[1] = -2147483648 must be in [0, max_pages x page_size = 16]", [1]))
add("kv_lens past the table", mutated(_poke("kv_lens", 2, 17), layout="paged"),
    V("kv_lens[2] = 17 must be in [0, max_pages x page_size = 16]", [2]))
add("kv_lens int32 max", mutated(_poke("kv_lens", 3, I32_MAX), layout="paged"),
    V("kv_lens[3] = 2147483647 must be in [0, max_pages x page_size = 16]", [3]))
add("block_table negative page", mutated(_poke("block_table", (0, 1), -1), layout="paged"),
    V("block_table[0][1] = -1 is not a page of kv_cache (6 pages)", [0]))
add("block_table page past the cache", mutated(_poke("block_table", (3, 0), 6), layout="paged"),
    V("block_table[3][0] = 6 is not a page of kv_cache (6 pages)", [3]))
add("block_table int32 max page", mutated(_poke("block_table", (2, 0), I32_MAX), layout="paged"),
    V("block_table[2][0] = 2147483647 is not a page of kv_cache (6 pages)", [2]))
add("block_table int32 min page", mutated(_poke("block_table", (1, 1), I32_MIN), layout="paged"),
    V("block_table[1][1] = -2147483648 is not a page of kv_cache (6 pages)", [1]))
add("causal item past its table", lambda dev: _causal_past_table(dev),
    V("kv_lens[0] = 17 must be in [0, max_pages x page_size = 16]", [0, 1]))
add("block table page count past int32", lambda dev: _page_count_past_int32(dev),
    V("block_table[0][0] = 2147483647 is not a page of kv_cache (0 pages)", [0]))
add("kv_lens past the keys an item may have", lambda dev: _too_many_keys(dev),
    V("kv_lens[0] = 2147450880 is more than the 2147418112 keys one item may have", [0]))


def _causal_past_table(dev):
    """Item 0 has two query tokens; the first sees only the first 16 of its 17 keys (inside the
    table), yet the item's kv_lens is malformed, so both of its rows are NaN."""
    a = base(dev, "paged")
    a["q"] = torch.cat([a["q"], a["q"][:1]])
    a["qo_indptr"] = _t([0, 2, 3, 4, 5], dev)
    a["kv_lens"] = _t([17, 12, 5, 8], dev)
    return a


def _page_count_past_int32(dev):
    """The issue's reproduction: (len + page_size - 1) / page_size overflows int32 (a SIGSEGV or a hang on
    the CPU before it was computed in int64)."""
    kv = torch.randn(2, 576).bfloat16().to(dev)
    q = torch.randn(1, 1, 576).bfloat16().to(dev)
    bt = torch.full((1, 32768), I32_MAX, dtype=torch.int32).to(dev)
    return dict(op="decode", q=q, kv_cache=kv, kv_scale=None, qo_indptr=_t([0, 1], dev), kv_indptr=None,
                kv_indices=None, block_table=bt, kv_lens=_t([32768 * 65535], dev), page_size=65535, sm_scale=SM,
                num_splits=0)


def _too_many_keys(dev):
    """Valid pages, but more keys than an item may have (the kernels' key positions stay in int32)."""
    a = _page_count_past_int32(dev)
    a["block_table"] = torch.zeros(1, 32768, dtype=torch.int32, device=dev)
    a["kv_cache"] = torch.zeros(65535, 576, dtype=torch.bfloat16, device=dev)
    return a


# ---- the checked mode ---------------------------------------------------------------------------------
add("checked mode on valid input", mutated(_set(op="api_checked")), Runs(), devices=("cpu", "cuda"))


def by_id() -> dict:
    return {c.id: c for c in CASES}


CHECKED_MODES = ("cuda-checked", "cuda-env")


def cases_for(device: str) -> list:
    """The cases a device runs. The GPU's checked modes: "cuda-checked" runs every BadValues case
    through decode(checked=True); "cuda-env" runs the BadValues and the valid cases with
    MLA_DECODE_CHECKED=1 (the runner sets it before the first call)."""
    if device == "cuda-checked":
        return [c for c in CASES if "cuda" in c.devices and isinstance(c.expect, BadValues)]
    if device == "cuda-env":
        return [c for c in CASES if "cuda" in c.devices and isinstance(c.expectation("cuda"), (BadValues, Runs))]
    return [c for c in CASES if device in c.devices]


# ---- running one case (in the runner's process) ------------------------------------------------------

def _args(a):
    return (a["q"], a["kv_cache"], a["kv_scale"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["block_table"],
            a["kv_lens"], a["page_size"], a["sm_scale"], a["num_splits"])


def execute(a, checked=False):
    """Runs the call; returns (out, lse)."""
    import mla_decode
    op = a["op"]
    if checked:
        op = "api_checked"
    if op == "decode":
        return torch.ops.mla_decode.decode(*_args(a))
    if op in ("decode_out", "decode_out_grad"):
        if op == "decode_out_grad":
            a["q"] = a["q"].float().requires_grad_().bfloat16()
        torch.ops.mla_decode.decode_out(*_args(a), a["out"], a["lse"])
        return a["out"], a["lse"]
    if op == "backward":
        out, lse = torch.ops.mla_decode.decode(a["q"].bfloat16(), *_args(a)[1:])
        out.float().sum().backward()
        return out, lse
    if op == "no_grad":
        q = a["q"].float().requires_grad_()
        with torch.no_grad():
            return torch.ops.mla_decode.decode(q.bfloat16(), *_args(a)[1:])
    if op == "api_checked":
        return mla_decode.decode(a["q"], a["kv_cache"], a["qo_indptr"], kv_scale=a["kv_scale"],
                                 kv_indptr=a["kv_indptr"], kv_indices=a["kv_indices"], block_table=a["block_table"],
                                 kv_lens=a["kv_lens"], page_size=a["page_size"], sm_scale=a["sm_scale"],
                                 num_splits=a["num_splits"], return_lse=True, checked=True)
    raise ValueError(op)


def reference_of(a):
    """float64 (out, lse) of a valid call, on the CPU."""
    from mla_decode.reference import dequantize_cache, reference_decode

    def cpu(t):
        return None if t is None else t.detach().cpu()
    rows = dequantize_cache(cpu(a["kv_cache"]), cpu(a["kv_scale"]), dtype=torch.float64)
    return reference_decode(cpu(a["q"]).double(), rows, cpu(a["qo_indptr"]), a["sm_scale"],
                            kv_indptr=cpu(a["kv_indptr"]), kv_indices=cpu(a["kv_indices"]),
                            block_table=cpu(a["block_table"]), kv_lens=cpu(a["kv_lens"]), page_size=a["page_size"])


def outcome_of(case: Case, device: str) -> dict:
    """What the call did: {"raised": type, "message": str} or {"ran": True, ...row classes..., "ref": error}."""
    dev = "cuda" if device.startswith("cuda") else device
    a = case.build(dev)
    try:
        out, lse = execute(a, checked=device == "cuda-checked")
        if dev == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the outcome is the exception
        return {"raised": type(exc).__name__, "message": str(exc).split("\nException raised from")[0]}
    result = {"ran": True, "device": str(out.device), "shape": list(out.shape)}
    if out.device.type == "meta":
        return result
    out64, lse64 = out.detach().cpu().double(), lse.detach().cpu().double()
    row_nan = (torch.isnan(out64).flatten(1).any(1) | torch.isnan(lse64).any(1))
    row_all_nan = (torch.isnan(out64).flatten(1).all(1) & torch.isnan(lse64).all(1))
    result["nan_tokens"] = row_nan.nonzero().flatten().tolist()
    result["all_nan_tokens"] = row_all_nan.nonzero().flatten().tolist()
    result["finite_out"] = bool(torch.isfinite(out64).all())
    if isinstance(case.expectation(dev), Runs):
        result["ref"] = _compare(a, out64, lse64)
    return result


def _compare(a, out64, lse64):
    """None when (out, lse) match the float64 reference within the tests' tolerances, else why not."""
    from cases import LSE_ABS_TOL, REL_FRO_TOL
    ref_out, ref_lse = reference_of(a)
    if not torch.isfinite(out64).all():
        return "non-finite output where the reference is finite"
    empty = torch.isinf(ref_lse) & (ref_lse < 0)
    if not (out64[empty] == 0).all() or not (torch.isinf(lse64[empty]) & (lse64[empty] < 0)).all():
        return "rows that see no key must be 0 with lse -inf"
    full = ~empty
    if full.any():
        rel = float((out64[full] - ref_out[full]).norm() / ref_out[full].norm())
        if rel >= REL_FRO_TOL:
            return f"relative Frobenius error {rel:.3e} >= {REL_FRO_TOL}"
        err = float((lse64[full] - ref_lse[full]).abs().max())
        if err >= LSE_ABS_TOL:
            return f"max |lse - ref| = {err:.3e} >= {LSE_ABS_TOL}"
    return None


def evaluate(case: Case, device: str, outcome: dict):
    """None when `outcome` is what `case` expects on `device`, else a sentence saying what differs."""
    if "crash" in outcome:
        return f"the call crashed or hung: {outcome['crash']}"
    dev = "cuda" if device.startswith("cuda") else device
    exp = case.expectation(dev)
    if device in CHECKED_MODES and isinstance(exp, BadValues):
        exp = Raises(exp.message)
    if isinstance(exp, BadValues) and dev != "cuda":
        exp = Raises(exp.message)
    if isinstance(exp, Raises):
        want = exp.message.replace("{dev}", str(torch.device(dev) if dev != "cuda" else "cuda:0")) \
            .replace("{other}", _OTHER[dev] if dev != "meta" else "meta")
        if "raised" not in outcome:
            return f"expected {exp.error}({want!r}), but the call ran"
        if outcome["raised"] != exp.error:
            return f"expected {exp.error}, got {outcome['raised']}: {outcome['message']}"
        if want not in outcome["message"]:
            return f"expected a message with {want!r}, got {outcome['message']!r}"
        if "argument" not in want and not outcome["message"].startswith("mla_decode"):
            return f"the message does not come from mla_decode: {outcome['message']!r}"
        return None
    if "raised" in outcome:
        return f"expected the call to run, but it raised {outcome['raised']}: {outcome['message']}"
    if dev == "meta":
        return None if outcome["device"] == "meta" else f"a meta call returned {outcome['device']} tensors"
    if isinstance(exp, Runs):
        return outcome.get("ref")
    # BadValues on the GPU: exactly the touched items' rows are NaN (every element), the rest finite.
    if outcome["nan_tokens"] != sorted(exp.nan_tokens) or outcome["all_nan_tokens"] != sorted(exp.nan_tokens):
        return (f"expected NaN rows exactly at tokens {sorted(exp.nan_tokens)}, got NaN in rows "
                f"{outcome['nan_tokens']} (entirely NaN: {outcome['all_nan_tokens']})")
    return None
