// Tensor-core forward instantiations for head dim 64 (bf16 and fp16); one file per head dim
// keeps each nvcc invocation small and lets ninja compile them in parallel.
#include "kernels/cuda/native/flash_fwd_launch.cuh"

RINGATTN_INSTANTIATE_FLASH_FORWARD(64)
