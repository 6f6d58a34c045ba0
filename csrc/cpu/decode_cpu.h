// The C++ CPU kernel of the mla_decode operators.
#pragma once

#include <stdint.h>

#include <string>

#include "common/params.h"

namespace mla_decode {

// The implementations of the CPU kernel. kAuto takes the fastest one this
// CPU supports; the others are for tests and A/B runs (an explicit override
// of the private operator, never an environment variable).
enum class CpuPath : uint8_t { kAuto = 0, kScalar = 1 };

struct CpuOptions {
  CpuPath path = CpuPath::kAuto;
};

// "auto", "scalar", ...; cpu_path_from_name returns false for an unknown name.
const char* cpu_path_name(CpuPath path);
bool cpu_path_from_name(const char* name, CpuPath* path);

// nullptr when `path` can run on this CPU, else the reason it cannot.
const char* cpu_path_unavailable(CpuPath path);

// Runs decode on the host for every (query row, head) of `p`. All pointers
// must be host pointers and every index must already be range-checked
// (check_index_values). Raises (TORCH_CHECK) if `opt.path` cannot run here.
void decode_cpu(const MlaDecodeParams& p, const CpuOptions& opt = {});

// What decode_cpu would run for `p` (for mla_decode.explain), as
// "key=value;..." fields: kernel=cpu_<path>, and the work split.
std::string describe_cpu_plan(const MlaDecodeParams& p, const CpuOptions& opt);

}  // namespace mla_decode
