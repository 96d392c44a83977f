// Tensor-core backward (dQ pass and dK/dV pass) instantiations for head dim 256.
#include "kernels/cuda/native/flash_bwd_launch.cuh"

RINGATTN_INSTANTIATE_FLASH_BACKWARD(256)
