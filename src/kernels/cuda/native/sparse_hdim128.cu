// Tensor-core block-sparse instantiations (forward, dQ and dK/dV) for head dim 128, bf16 and
// fp16; one file per head dim keeps each nvcc invocation small.
#include "kernels/cuda/native/sparse_launch.cuh"

RINGATTN_INSTANTIATE_SPARSE(128)
