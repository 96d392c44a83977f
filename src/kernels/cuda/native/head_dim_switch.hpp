// Runtime head dim → compile-time instantiation: the one switch (the BOOL_SWITCH habit of
// STYLE.md) that flash_dispatch.cpp and sparse_dispatch.cpp both go through. Also the check
// of a kernel family's shared memory against a device's opt-in limit.
#pragma once

#include <string>

#include "kernels/cuda/params.hpp"
#include "kernels/cuda/tiles.hpp"

namespace ringattn::kernels::cuda {

// Calls f.template operator()<E, D>() with D the padded head dim (64, 128 or 256).
template <Elem E, typename F>
void head_dim_switch(int head_dim, F&& f) {
  switch (padded_head_dim(head_dim)) {
    case 64:
      f.template operator()<E, 64>();
      break;
    case 128:
      f.template operator()<E, 128>();
      break;
    default:
      f.template operator()<E, 256>();
      break;
  }
}

// Empty when `need` bytes of shared memory per block fit `device`'s opt-in limit; otherwise
// a note naming `kernels` ("tensor-core", "block-sparse tensor-core"), the sizes and the limit.
std::string opt_in_shortfall(const char* kernels, Elem e, int head_dim, int need, int device);

}  // namespace ringattn::kernels::cuda
