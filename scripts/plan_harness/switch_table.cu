// Prints, per cache format, how the kernel switches MLA_DECODE_{BF16,FP8,MXFP4}_KERNEL
// of the current environment are read (kernel_switch, decode_launch.cu) and
// whether they force the Hopper wide / narrow kernels: the user-facing meaning
// of those variables, checked without a GPU by tests/test_kernel_switches.py.
// Built with nvcc against csrc/cuda (every TU: decode_launch.cu needs the
// format launchers); nothing here touches a device.
#include <cstdio>

#include "cuda/decode_common.h"

using namespace mla_decode;
using namespace mla_decode::cuda;

int main() {
  const KvFormat formats[] = {KvFormat::kBf16, KvFormat::kFp8E4M3FN, KvFormat::kFp8E4M3FNUZ, KvFormat::kMxfp4};
  const char* names[] = {"bf16", "fp8", "fp8_fnuz", "mxfp4"};
  for (int i = 0; i < 4; ++i) {
    std::printf("%s switch=%d wide_forced=%d narrow_forced=%d\n", names[i], static_cast<int>(kernel_switch(formats[i])),
                wide_kernel_forced(formats[i]) ? 1 : 0, narrow_kernel_forced(formats[i]) ? 1 : 0);
  }
  return 0;
}
