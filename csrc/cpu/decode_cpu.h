#pragma once

#include "../mla_decode/params.h"

namespace mla_decode {

// Runs decode on the host for every (query row, head) of `p`. All pointers
// must be host pointers and every index must already be range-checked
// (check_index_values).
void decode_cpu(const MlaDecodeParams& p);

}  // namespace mla_decode
