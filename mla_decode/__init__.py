"""mla_decode: Multi-head Latent Attention decode kernels for PyTorch.

    import mla_decode
    out = mla_decode.decode(q, kv_cache, qo_indptr, kv_indptr=kv_indptr)
    out = mla_decode.custom_kernel(data)      # the competition tuple interface

Operators: torch.ops.mla_decode.decode / decode_out (csrc/api/schema.cpp).
"""

from . import _ops  # noqa: F401  (loads the operators, registers fake kernels)
from .api import DEFAULT_SM_SCALE, DeviceFacts, Plan, decode, explain, info
from .competition import custom_kernel

from ._version import BASE_VERSION as _BASE_VERSION

# The built version carries the torch/CUDA/ROCm it was compiled for, e.g.
# 0.1.0+torch2.13.0.cpu; a never-built source tree reports the base version.
__version__ = getattr(_ops.BUILD_INFO, "VERSION", _BASE_VERSION)

__all__ = ["decode", "explain", "DeviceFacts", "Plan", "custom_kernel", "info", "DEFAULT_SM_SCALE", "__version__"]
