// The small enums a JobSpec, a TensorRef and EngineStats speak in, with their printed names.
#pragma once

#include <cstddef>

namespace ringattn {

// Where the kernels run. automatic: the GPU when this build has CUDA kernels, a device is
// usable, the tensors are [B, N, H, D] and the job is dense or dilated on one rank; the CPU
// otherwise (block-sparse and head-major jobs stay on the CPU unless cuda is asked for).
enum class Device { automatic, cpu, cuda };

// How the ranks of a GPU job exchange device memory. automatic: NCCL with one process per
// GPU, device-to-device copies for virtual ranks sharing a GPU; nccl: NCCL only; local: the
// in-process transport of virtual ranks (device copies on GPUs); mpi: host memory over MPI,
// which the GPU engines do not take (refused, naming `transport`). CPU jobs exchange over the
// Comm they are given.
enum class Transport { automatic, nccl, mpi, local };

// What the device kernels read q, k, v and dout in (results are always fp32).
enum class DeviceDType { bf16, fp16, fp32 };

// The bytes one element of `t` takes: 4 for fp32, 2 for bf16 and fp16.
constexpr std::size_t bytes_per_element(DeviceDType t) { return t == DeviceDType::fp32 ? 4 : 2; }

// The GPU's forward kernel. native: ours on mma.sync; cudnn: cuDNN's fused SDPA where it
// applies (otherwise native, with a note); hopper: the sm_90a kernels (TMA + wgmma; head dims
// 64, 128 and 256, bf16/fp16) where they apply, the native ones otherwise; automatic: cuDNN
// where it applies and times faster, else the sm_90a kernels where they run, else native.
enum class KernelChoice { automatic, native, cudnn, hopper };

// Where a TensorRef's memory is.
enum class Memory { host, device };

const char* to_string(Device d);
const char* to_string(Transport t);
const char* to_string(DeviceDType t);
const char* to_string(KernelChoice k);

}  // namespace ringattn
