// Maps the Elem tag that host code passes around to the CUDA element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

template <Elem E>
struct ElemType;
template <>
struct ElemType<Elem::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct ElemType<Elem::fp16> {
  using type = __half;
};
template <>
struct ElemType<Elem::fp32> {
  using type = float;
};

}  // namespace ringattn::kernels::cuda
