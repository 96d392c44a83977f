// Tile shapes shared by the CUDA kernels and the host code that builds their work items
// (no CUDA headers here, so host-only code and its tests can use them in any build).
#pragma once

#include <cstdint>

namespace ringattn::kernels::cuda {

// Tensor-core kernels: 4 warps of 16 rows each, 64 rows per block. Forward and dQ items
// cover kQueryTile query rows of a task; dK/dV items kKeyTile key rows.
constexpr int kQueryTile = 64;
constexpr int kKeyTile = 64;

// Head dims with a tensor-core instantiation; other head dims run on the next larger one,
// with the extra columns read as zeros and never written.
constexpr int padded_head_dim(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

}  // namespace ringattn::kernels::cuda
