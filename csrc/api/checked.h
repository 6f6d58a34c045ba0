// The checked mode: the CPU's index-value checks on a GPU call, at the cost
// of one host sync (copying the index tensors to the host). Asked for per call
// (mla_decode.decode(..., checked=True), which calls the private operator
// _check_index_values registered in checked.cpp) or for a whole process
// (MLA_DECODE_CHECKED=1, read at the first GPU call; the GPU dispatcher then
// checks every call).
#pragma once

namespace mla_decode {

// MLA_DECODE_CHECKED, read once: 1 / true / yes / on, or 0 / false / no / off /
// unset; any other value raises (each call, until it is fixed).
bool checked_mode_from_env();

}  // namespace mla_decode
