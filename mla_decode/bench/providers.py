"""What the benchmark times: mla_decode, the peers (FlashMLA, FlashInfer) and the
streaming floor.

Every provider of a shape reads the same input sets: the competition's rotated
seeds, or the sweep's rotated copies (the peers read the bf16 copies that
mla_decode's bf16 row reads). Set-up that serving does once per step and reuses
over layers (FlashMLA's scheduler metadata, FlashInfer's plan) happens in
prepare(), outside the timing.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from .metrics import D_QK, D_V, cache_bytes


def cache_of(kv_data: dict, fmt: str):
    """(cache, scale) of one format of the contract's kv_data."""
    entry = kv_data[fmt]
    return (entry, None) if fmt == "bf16" else (entry[0], entry[1])


def op_call(q, kv, scale, qo_indptr, kv_indptr, sm_scale):
    """One torch.ops.mla_decode.decode call on an indptr cache (the sweep's unit of work)."""
    out, _ = torch.ops.mla_decode.decode(q, kv, scale, qo_indptr, kv_indptr, None, None, None, 1, sm_scale, 0)
    return out


# --------------------------------------------------------------------------------------------
# Streaming floor
# --------------------------------------------------------------------------------------------

class StreamFloor:
    """A kernel that only reads a cache's bytes (torch.ops.mla_decode._stream_read: every byte of a
    contiguous CUDA tensor once, into a one-element int64 sink): the least time a decode of that
    format can take under the same protocol."""

    name = "stream"

    def __init__(self, device: torch.device):
        self.available = (device.type == "cuda" and hasattr(torch.ops, "mla_decode")
                          and hasattr(torch.ops.mla_decode, "_stream_read"))
        if device.type != "cuda":
            self.reason = "needs CUDA"
        elif not self.available:
            self.reason = "this build has no torch.ops.mla_decode._stream_read"
        else:
            self.reason = ""
        self.sink = torch.zeros(1, dtype=torch.int64, device=device) if self.available else None

    def buffers(self, fmt: str, tokens: int, n_sets: int, device: torch.device) -> list:
        """One byte buffer per input set, the size of that set's cache in fmt (MXFP4: codes and
        scales together), written once (as a freshly made cache is)."""
        return [torch.zeros(cache_bytes(fmt, tokens), dtype=torch.uint8, device=device) for _ in range(n_sets)]

    def call(self, buf):
        torch.ops.mla_decode._stream_read(buf, self.sink)


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------

def _uniform_len(kv_indptr: torch.Tensor, batch: int, total_kv: int) -> int:
    if batch == 0 or total_kv % batch:
        raise ValueError(f"the peers take equal KV lengths (the benchmark's inputs); got {total_kv} tokens over "
                         f"{batch} items")
    return total_kv // batch


class Peer:
    """Another library's MLA decode on the bf16 cache."""

    name = "peer"
    fmt = "bf16"
    module = ""
    required = ("", "")     # (module, attribute) that must exist

    def __init__(self):
        self.available = False
        self.reason = "not probed"
        self.version = None
        self.mod = None

    def probe(self, device: torch.device) -> None:
        if device.type != "cuda":
            self.reason = "needs CUDA"
            return
        try:
            self.mod = importlib.import_module(self.module)
            where, attr = self.required
            getattr(importlib.import_module(where), attr)
            self.version = getattr(self.mod, "__version__", "unknown")
            self.available = True
            self.reason = ""
        except Exception as exc:  # noqa: BLE001 - skipped, with the reason printed
            self.reason = f"not importable ({type(exc).__name__}: {exc})"

    def prepare(self, sets, qo_indptr, kv_indptr, config) -> list:
        """sets: [(q, kv_bf16)] (the rotated input sets); returns one state per set."""
        raise NotImplementedError

    def call(self, state) -> torch.Tensor:
        """One decode: (total_q, H, 512) bf16."""
        raise NotImplementedError


class FlashMLAPeer(Peer):
    """FlashMLA's dense decode on the bf16 cache viewed as pages of 64 tokens (zero-copy: the
    lengths are multiples of 64 and each set's cache is contiguous).

    Both FlashMLA interfaces: the current one (get_mla_metadata() with no arguments returns a
    scheduler-metadata object and None; the first flash_mla_with_kvcache call with that object
    fills it, num_splits=None) and the older one (get_mla_metadata(cache_seqlens,
    s_q * h_q, 1) returns two tensors). One metadata per input set, made (and, current
    interface, filled by a first call) in prepare()."""

    name = "flash_mla"
    module = "flash_mla"
    required = ("flash_mla", "flash_mla_with_kvcache")
    PAGE = 64

    def probe(self, device):
        super().probe(device)
        if self.available:
            self.api = self.interface(self.mod.get_mla_metadata)

    @staticmethod
    def interface(get_mla_metadata) -> str:
        """"current" when get_mla_metadata takes no required argument, else "three-argument"."""
        try:
            params = inspect.signature(get_mla_metadata).parameters.values()
        except (TypeError, ValueError):
            return "current"
        required = [p for p in params if p.default is inspect.Parameter.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return "three-argument" if required else "current"

    def prepare(self, sets, qo_indptr, kv_indptr, config):
        b, s_q = int(config["batch_size"]), int(config["q_seq_len"])
        q0, kv0 = sets[0]
        L = _uniform_len(kv_indptr, b, kv0.shape[0])
        if L % self.PAGE:
            raise ValueError(f"kv_len {L} is not a multiple of FlashMLA's page size {self.PAGE}")
        h, dev = q0.shape[1], q0.device
        n_pages = kv0.shape[0] // self.PAGE
        table = torch.arange(n_pages, dtype=torch.int32, device=dev).view(b, L // self.PAGE)
        seqlens = torch.full((b,), L, dtype=torch.int32, device=dev)
        states = []
        for q, kv in sets:
            st = {"q": q.view(b, s_q, h, D_QK), "k": kv.view(n_pages, self.PAGE, 1, D_QK), "table": table,
                  "seqlens": seqlens, "sm": float(config["sm_scale"]), "shape": (b * s_q, h, D_V),
                  "causal": s_q > 1}  # MTP: the bottom-right causal mask, as mla_decode's
            if self.api == "current":
                st["meta"], st["splits"] = self.mod.get_mla_metadata()
                self.call(st)                 # fills this set's metadata, outside the timing
            else:
                st["meta"], st["splits"] = self.mod.get_mla_metadata(seqlens, s_q * h, 1)
            states.append(st)
        return states

    def call(self, st):
        out, _ = self.mod.flash_mla_with_kvcache(st["q"], st["k"], st["table"], st["seqlens"], D_V, st["meta"],
                                                 st["splits"], softmax_scale=st["sm"], causal=st["causal"])
        return out.view(st["shape"])


class FlashInferPeer(Peer):
    """FlashInfer's BatchMLAPagedAttentionWrapper on the bf16 cache split into its latent (512)
    and rope (64) parts as strided views (contiguous copies when the views are refused); one
    plan() per shape (it depends on the lengths only), outside the timing."""

    name = "flashinfer"
    module = "flashinfer"
    required = ("flashinfer.mla", "BatchMLAPagedAttentionWrapper")
    PAGE = 64
    _workspace = None

    def prepare(self, sets, qo_indptr, kv_indptr, config):
        from flashinfer.mla import BatchMLAPagedAttentionWrapper
        b, s_q = int(config["batch_size"]), int(config["q_seq_len"])
        q0, kv0 = sets[0]
        L = _uniform_len(kv_indptr, b, kv0.shape[0])
        h, dev = q0.shape[1], q0.device
        page = self.PAGE if L % self.PAGE == 0 else 1
        if FlashInferPeer._workspace is None:
            FlashInferPeer._workspace = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device=dev)
        w = BatchMLAPagedAttentionWrapper(FlashInferPeer._workspace, backend="auto")
        ppb = L // page
        w.plan(qo_indptr, torch.arange(b + 1, dtype=torch.int32, device=dev) * ppb,
               torch.arange(b * ppb, dtype=torch.int32, device=dev), torch.full((b,), L, dtype=torch.int32, device=dev),
               h, D_V, D_QK - D_V, page, s_q > 1, float(config["sm_scale"]), q0.dtype, kv0.dtype)
        states = []
        for q, kv in sets:
            paged = kv.view(-1, page, D_QK)
            st = {"w": w, "q_nope": q[..., :D_V], "q_pe": q[..., D_V:], "ckv": paged[..., :D_V],
                  "kpe": paged[..., D_V:], "shape": (q.shape[0], h, D_V)}
            try:
                self.call(st)
            except Exception:  # noqa: BLE001 - strided views refused: contiguous copies
                st.update(q_nope=st["q_nope"].contiguous(), q_pe=st["q_pe"].contiguous(),
                          ckv=st["ckv"].contiguous(), kpe=st["kpe"].contiguous(), copied=True)
            states.append(st)
        return states

    def call(self, st):
        out = st["w"].run(st["q_nope"], st["q_pe"], st["ckv"], st["kpe"])
        return out.view(st["shape"])


PEER_CLASSES = {"flash_mla": FlashMLAPeer, "flashinfer": FlashInferPeer}
