// Tile geometry shared by the kernels, their launchers and the plan. Plain
// constexpr, no CUDA headers: csrc/plan is ordinary C++ compiled on every
// machine (the CPU build tests the plan).
#pragma once

namespace mla_decode {
namespace cuda {

// Query rows (heads of one query token) per CTA.
constexpr int kTileRows = 16;    // the mma.sync and MFMA kernels: the M of their MMA
constexpr int kWideRows = 64;    // the Hopper wide kernel: the M of its wgmma
constexpr int kNarrowRows = 16;  // the Hopper narrow kernels: the N of their wgmma

// Keys per pipeline stage of the mma.sync and MFMA kernels; their KV splits
// are whole multiples of it.
constexpr int kBlockN = 32;

// Keys per tile of the Hopper kernels (the wide kernel's K of PV, the narrow
// kernels' M of QK).
constexpr int kHopperTileTokens = 64;

}  // namespace cuda
}  // namespace mla_decode
