// Shadows a ROCm >= 6 <hip/hip_bf16.h> for the host emulation (the kernels do not need it).
#pragma once
