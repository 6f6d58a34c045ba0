"""The release version; setup.py appends the torch/CUDA/ROCm build as a PEP 440
local label (0.1.0+torch2.13.0.cpu, 0.1.0+torch2.11.0.cu130, ...)."""

BASE_VERSION = "0.1.0"
