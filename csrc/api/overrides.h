// The overrides string of the private operator _decode_out_with and of
// explain(): "key=value" pairs separated by ';'. They never come from the
// environment; tests, benchmarks and A/B runs pass them explicitly
// (mla_decode.decode(..., _overrides=...), mla_decode.explain(...)).
//
//   kernel=<name>         force a split kernel (plan::kernel_name spelling);
//                         an error if it cannot run the call
//   smem_limit=<bytes>    plan as if a block could opt in to at most this
//                         much shared memory (the 99 KB rings on an H200)
//   cpu_path=<name>       the CPU kernel's implementation (cpu::CpuPath)
//   device facts, all optional, replacing the current device's
//   (mla_decode.DeviceFacts; planning for another GPU, e.g. on a CPU):
//     vendor=nvidia|amd  arch=<int>  sm90a=0|1  tensor_maps=0|1
//     num_sms=<int>  smem_per_block=<bytes>  smem_per_sm=<bytes>  l2_bytes=<bytes>
#pragma once

#include <string>

#include "cpu/decode_cpu.h"
#include "plan/plan.h"

namespace mla_decode {

struct ParsedOverrides {
  plan::Overrides plan;  // num_splits is the operator's own argument, set by the caller
  CpuOptions cpu;
  bool has_facts = false;   // some device fact was given: plan for `facts`
  plan::DeviceFacts facts;  // starts from the defaults of a "vendor=nvidia" device
};

// Parses `text`; raises with a sentence naming the key on anything it does not
// understand.
ParsedOverrides parse_overrides(const std::string& text);

// Facts not given by the overrides are taken from `base`.
plan::DeviceFacts merge_facts(const std::string& text, const plan::DeviceFacts& base);

// "kernel=...;head_groups=...;splits=...;stages=...;smem=...;smem_limit=...;
// stream_kv=0|1;why=...;not=<kernel>: <reason>|..." for explain().
std::string describe_plan(const plan::Plan& plan, const MlaDecodeParams& p, const plan::DeviceFacts& facts);

}  // namespace mla_decode
