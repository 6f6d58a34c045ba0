"""mla_decode: Multi-head Latent Attention decode kernels for PyTorch."""
from . import _ops  # noqa: F401  (loads the operators)
