"""The friendly Python API over torch.ops.mla_decode."""

from __future__ import annotations

import dataclasses
import math
import os

import torch

from . import _ops

DEFAULT_SM_SCALE = 1.0 / math.sqrt(576)


def _env_checked() -> bool:
    """MLA_DECODE_CHECKED=1: the GPU operators check index values themselves (csrc/api/checked.h)."""
    return os.environ.get("MLA_DECODE_CHECKED", "0").lower() in ("1", "true", "yes", "on")


def _overrides_text(overrides) -> str:
    """{'kernel': 'wide', 'smem_limit': 101376} or a DeviceFacts -> the operators' "k=v;..." string."""
    if overrides is None:
        return ""
    if isinstance(overrides, DeviceFacts):
        overrides = overrides.as_overrides()
    if not isinstance(overrides, dict):
        raise TypeError(f"mla_decode: overrides must be a dict (or DeviceFacts), got {type(overrides).__name__}")
    items = {}
    for key, value in overrides.items():
        if isinstance(value, DeviceFacts):
            items.update(value.as_overrides())
        else:
            items[key] = int(value) if isinstance(value, bool) else value
    for key, value in items.items():
        if any(c in str(key) + str(value) for c in ";="):
            raise ValueError(f"mla_decode: override {key}={value!r} may not contain ';' or '='")
    return ";".join(f"{k}={v}" for k, v in items.items())


def decode(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, *,
           kv_scale: torch.Tensor | None = None,
           kv_indptr: torch.Tensor | None = None,
           kv_indices: torch.Tensor | None = None,
           block_table: torch.Tensor | None = None,
           kv_lens: torch.Tensor | None = None,
           page_size: int = 1,
           sm_scale: float | None = None,
           num_splits: int = 0,
           out: torch.Tensor | None = None,
           lse: torch.Tensor | None = None,
           return_lse: bool = False,
           checked: bool = False,
           _overrides: dict | None = None):
    """Absorbed MLA decode attention over a latent KV cache.

    For query token i of batch item b and head h, with the item's keys K
    (rows of the cache, V = K[:, :512]):

        out[i, h] = softmax(sm_scale * q[i, h] @ K.T) @ K[:, :512]
        lse[i, h] = logsumexp(sm_scale * q[i, h] @ K.T)      (natural log)

    with a bottom-right causal mask when an item has several query tokens
    (query i of Q sees the first L - Q + i + 1 of its L keys). Rows that see
    no key get out = 0 and lse = -inf.

    Shapes and dtypes:
      q           (total_q, H, 576) bfloat16, 1 <= H <= 128; last dim contiguous.
      kv_cache    the cache; its dtype picks the format:
                    bfloat16                 rows of 576 values (1152 bytes)
                    float8_e4m3fn / e4m3fnuz rows of 576 codes; kv_scale: float32 (1,),
                                             value = code * kv_scale
                    uint8 / float4_e2m1fn_x2 rows of 288 bytes, two E2M1 codes per
                                             byte, element 2k in the low nibble of byte
                                             k; kv_scale: E8M0 bytes (rows, >= 18),
                                             value = code * 2^(scale[row, k // 32] - 127)
                  shape (rows, D), (rows, 1, D), or with block_table
                  (pages, page_size, D) / (pages, page_size, 1, D); D = 576 or 288.
      qo_indptr   (B + 1,) int32: item b owns q rows qo_indptr[b]:qo_indptr[b+1].
      kv_indptr   (B + 1,) int32: item b owns tokens kv_indptr[b]:kv_indptr[b+1]
                  (cache rows, or positions in kv_indices when given).
      kv_indices  (N,) int32, optional: cache row of each token position.
      block_table (B, max_pages) int32 with kv_lens (B,) int32 and page_size: paged
                  cache, token j of item b at row block_table[b, j // page_size] *
                  page_size + j % page_size.
      sm_scale    default 1 / sqrt(576).
      num_splits  KV splits per query row on the GPU (0 = automatic).
      out, lse    optional preallocated outputs: (total_q, H, 512) bfloat16 and
                  (total_q, H) float32.
      checked     on a GPU, first check every index value on the host, as the CPU
                  always does, and raise the CPU's error for a bad one (one host
                  sync per call; not inside CUDA graph capture). MLA_DECODE_CHECKED=1
                  does the same for every GPU call of a process, direct operator
                  calls included. No effect on the CPU, which always checks.
      _overrides  test and A/B use only: force a plan, e.g. {"kernel": "wide"},
                  {"smem_limit": 101376}, {"cpu_path": "scalar"} (explain() shows
                  the plan a call runs; csrc/api/overrides.h lists the keys).

    Returns out, or (out, lse) when return_lse=True.

    Bad shapes, dtypes, devices, strides and sizes raise everywhere, naming the
    argument. Index values: on the CPU every one is checked and a bad one
    raises. On the GPU nothing here synchronises with the host, so calls can
    be captured in CUDA graphs, and index values are not checked (that would
    need a sync) unless checked=True: the kernels never read out of bounds,
    and an item whose index values are malformed (an indptr entry out of range
    or out of order at or next to it, a negative kv_lens, more keys than its
    block table holds) gives NaN rows, as do the rows that see a key whose row
    is outside the cache.
    """
    if not _ops.native_available():
        raise RuntimeError(_ops.LOAD_ERROR)
    if sm_scale is None:
        sm_scale = DEFAULT_SM_SCALE
    if checked and isinstance(q, torch.Tensor) and q.device.type not in ("cpu", "meta") and not _env_checked():
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("mla_decode: checked=True copies the index tensors to the host, which CUDA graph "
                               "capture forbids; pass checked=False to capture.")
        torch.ops.mla_decode._check_index_values(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices,
                                                 block_table, kv_lens, page_size)
    if _overrides is not None:
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], 512), dtype=torch.bfloat16)
        if lse is None:
            lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
        torch.ops.mla_decode._decode_out_with(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table,
                                              kv_lens, page_size, float(sm_scale), num_splits, out, lse,
                                              _overrides_text(_overrides))
    elif out is None and lse is None:
        out, lse = torch.ops.mla_decode.decode(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices,
                                               block_table, kv_lens, page_size, float(sm_scale), num_splits)
    else:
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], 512), dtype=torch.bfloat16)
        if lse is None:
            lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
        torch.ops.mla_decode.decode_out(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table,
                                        kv_lens, page_size, float(sm_scale), num_splits, out, lse)
    return (out, lse) if return_lse else out


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the plan knows about a GPU (csrc/plan/plan.h, DeviceFacts). explain(..., device=...)
    plans a call for such a device from shapes alone, on any machine."""

    vendor: str = "nvidia"          # "nvidia" or "amd"
    arch: int = 90                  # NVIDIA: 10 * major + minor; AMD: the gfx number
    sm90a: bool = True              # the build has sm_90a code and the device runs it
    tensor_maps: bool = True        # the driver encodes TMA tensor maps
    num_sms: int = 132
    smem_per_block: int = 232448    # bytes a block may opt in to
    smem_per_sm: int = 233472
    l2_bytes: int = 50 * 2**20

    @classmethod
    def h200(cls) -> "DeviceFacts":
        """An H100 / H200 (SXM) with a build that has sm_90a code (the default build)."""
        return cls()

    @classmethod
    def a100(cls) -> "DeviceFacts":
        return cls(arch=80, sm90a=False, tensor_maps=True, num_sms=108, smem_per_block=166912,
                   smem_per_sm=167936, l2_bytes=40 * 2**20)

    @classmethod
    def mi300x(cls) -> "DeviceFacts":
        return cls(vendor="amd", arch=942, sm90a=False, tensor_maps=False, num_sms=304, smem_per_block=65536,
                   smem_per_sm=65536, l2_bytes=4 * 2**20)

    def as_overrides(self) -> dict:
        return {"vendor": self.vendor, "arch": self.arch, "sm90a": int(self.sm90a),
                "tensor_maps": int(self.tensor_maps), "num_sms": self.num_sms,
                "smem_per_block": self.smem_per_block, "smem_per_sm": self.smem_per_sm,
                "l2_bytes": self.l2_bytes}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan of one decode call (mla_decode.explain)."""

    kernel: str                 # mma_sync, wide, narrow, narrow_register_v, mfma, or cpu_<path>
    why: str                    # the rule that chose it
    splits: int | None = None   # KV splits per (query token, head group)
    head_groups: int | None = None
    stages: int | None = None   # the mma.sync kernel's cp.async ring depth (0: another kernel)
    smem_bytes: int | None = None
    smem_limit: int | None = None
    stream_kv: bool | None = None  # TMA tile loads with the L2 evict_first hint
    tma_tiles: bool | None = None  # the split kernel's tiles land by TMA
    error: str | None = None    # why the call cannot run as planned (a forced kernel that does not apply)
    rejected: dict = dataclasses.field(default_factory=dict)  # other kernel -> why it did not run
    fields: dict = dataclasses.field(default_factory=dict)    # every field the operator returned

    def __str__(self) -> str:
        parts = [self.kernel]
        for name in ("splits", "head_groups", "stages", "smem_bytes", "stream_kv", "tma_tiles"):
            value = getattr(self, name)
            if value not in (None, 0, False) or name == "splits" and value is not None:
                parts.append(f"{name}={value}")
        extra = {k: v for k, v in self.fields.items()
                 if k not in ("kernel", "why", "splits", "head_groups", "stages", "smem", "smem_limit",
                              "stream_kv", "tma_tiles", "error", "not")}
        parts += [f"{k}={v}" for k, v in extra.items()]
        text = " ".join(parts) + f": {self.why}"
        if self.error:
            text += f" [cannot run: {self.error}]"
        return text


def _parse_plan(text: str) -> Plan:
    fields = {}
    for item in text.split(";"):
        key, _, value = item.partition("=")
        fields[key] = value
    rejected = {}
    for entry in filter(None, fields.get("not", "").split("|")):
        name, _, reason = entry.partition(": ")
        rejected[name] = reason

    def num(key):
        return int(fields[key]) if key in fields else None

    return Plan(kernel=fields.get("kernel", "?"), why=fields.get("why", ""), splits=num("splits"),
                head_groups=num("head_groups"), stages=num("stages"), smem_bytes=num("smem"),
                smem_limit=num("smem_limit"), stream_kv=bool(num("stream_kv")) if "stream_kv" in fields else None,
                tma_tiles=bool(num("tma_tiles")) if "tma_tiles" in fields else None,
                error=fields.get("error"), rejected=rejected, fields=fields)


def explain(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, *,
            kv_scale: torch.Tensor | None = None,
            kv_indptr: torch.Tensor | None = None,
            kv_indices: torch.Tensor | None = None,
            block_table: torch.Tensor | None = None,
            kv_lens: torch.Tensor | None = None,
            page_size: int = 1,
            sm_scale: float | None = None,
            num_splits: int = 0,
            device: DeviceFacts | None = None,
            overrides: dict | None = None) -> Plan:
    """The plan a decode() call with the same arguments runs: which kernel, how many KV splits,
    the ring depth, and why (and why each other kernel did not run). Reads shapes only.

    device: plan for another GPU (DeviceFacts.h200(), .a100(), .mi300x(), or your own), e.g. on a
    machine without one; by default the tensors' own device (CPU tensors: the CPU kernel's plan).
    overrides: as decode()'s _overrides (e.g. {"kernel": "narrow"}).

        >>> print(mla_decode.explain(q, kv, qo_indptr, kv_indptr=kv_indptr, device=DeviceFacts.h200()))
        narrow splits=32 head_groups=1 smem_bytes=168864 stream_kv=True: H < 64 on Hopper, ...
    """
    if not _ops.native_available():
        raise RuntimeError(_ops.LOAD_ERROR)
    if sm_scale is None:
        sm_scale = DEFAULT_SM_SCALE
    merged = {}
    if device is not None:
        if not isinstance(device, DeviceFacts):
            raise TypeError(f"mla_decode.explain: device must be a DeviceFacts, got {type(device).__name__}")
        merged.update(device.as_overrides())
    merged.update(overrides or {})  # explicit overrides win over the device's facts
    text = torch.ops.mla_decode.explain(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table,
                                        kv_lens, page_size, float(sm_scale), num_splits, _overrides_text(merged))
    return _parse_plan(text)


def info() -> dict:
    """What this build contains: backends, archs, the torch it was built against."""
    b = _ops.BUILD_INFO
    built = {} if b is None else {
        "version": b.VERSION, "backend": b.BACKEND, "torch": b.TORCH_VERSION, "cuda": b.CUDA_VERSION,
        "hip": b.HIP_VERSION, "cuda_archs": b.CUDA_ARCHS, "rocm_archs": b.ROCM_ARCHS}
    backends = torch.ops.mla_decode.backends() if _ops.native_available() else None
    return {"native": _ops.native_available(), "load_error": _ops.LOAD_ERROR, "compiled_backends": backends,
            "built_with": built, "runtime_torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
