// The library API every front end calls: a typed JobSpec (the whole problem, where and how to
// run it) and a Comm (who takes part) go into make_engine, which resolves every `auto`,
// validates, lays out the shards, builds the plan and allocates once; the Engine then runs
// forward and backward on this rank's shard. The CLI and the Python package are thin layers
// over this header; a C++ program runs a distributed job with it directly (docs/API.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/config.hpp"
#include "ringattn/cuda_plan.hpp"  // DeviceDType, KernelChoice, probe_cuda_device
#include "ringattn/errors.hpp"

namespace ringattn {

namespace ring {
class Communicator;
}

// Where the kernels run. automatic: the GPU when this build has CUDA kernels, a device is
// usable, the tensors are [B, N, H, D] and the job is dense or dilated on one rank; the CPU
// otherwise (block-sparse and head-major jobs stay on the CPU unless cuda is asked for).
enum class Device { automatic, cpu, cuda };
const char* to_string(Device d);

// How the ranks of a GPU job exchange device memory. automatic: NCCL with one process per
// GPU, device-to-device copies for virtual ranks sharing a GPU; nccl: NCCL only; local: the
// in-process transport of virtual ranks (device copies on GPUs); mpi: host memory over MPI,
// which the GPU engines do not take (refused, naming --comm). CPU jobs exchange over the
// Comm they are given.
enum class Transport { automatic, nccl, mpi, local };
const char* to_string(Transport t);

// Where a block-sparse job's (query block, key block) lists come from: the --pattern
// language (docs/SEMANTICS.md), or an explicit bool mask [H, nb, nb] or [nb, nb] (nb = N /
// block size, C order). `mask_name` is how messages name the mask ("--block-mask (m.npy)",
// "block_mask").
struct BlockSparseSource {
  std::string pattern;
  std::shared_ptr<const std::vector<uint8_t>> mask;
  std::vector<int64_t> mask_dims;
  std::string mask_name = "block_mask";
  uint64_t seed = 0;  // the random generator's seed
};

struct JobSpec {
  // The whole problem: the full sequence's shape [B, N, H, D], the attention kind and its
  // pattern, causal, scale, window, documents, GQA (kv_heads), the tensors' layout. With
  // attention_auto, config.attention is dense or dilated and the job switches to
  // block-sparse (the dilated-blocks pattern) past sparse_threshold tokens.
  AttentionConfig config;
  bool attention_auto = false;
  int64_t sparse_threshold = int64_t{1} << 20;
  BlockSparseSource block_sparse;  // config.attention == block_sparse
  Device device = Device::automatic;
  // What the device kernels read q, k, v and dout in: bf16 by default on GPUs. The CPU
  // computes in fp32 (anything else is refused, naming --dtype).
  std::optional<DeviceDType> dtype;
  KernelChoice kernel = KernelChoice::automatic;  // the GPU's forward kernel
  Transport transport = Transport::automatic;
  // The GPU of a cuda job on this rank; -1: by rank (the node-local rank with one process
  // per GPU, rank modulo the GPUs for virtual ranks sharing them). Front ends whose tensors
  // already live on a device (PyTorch) pass that device.
  int device_index = -1;
  // Bitwise-reproducible results run to run (docs/SEMANTICS.md, "Determinism"). The CPU
  // engines always are (one writer per element, fixed orders); on GPUs this makes the kernel
  // choice a rule instead of a timing and keeps backward kernels that accumulate with
  // atomics (cuDNN's dQ) out, at some speed. Default: the fast choice, whose run-to-run
  // differences stay within the dtype's tolerance.
  bool deterministic = false;
  int threads = 0;         // CPU threads per rank (0: OpenMP's default)
  double timeout_s = 300;  // watchdog: longest wait for one exchange or collective
  // Ulysses x ring (docs/COMMUNICATION.md): the world's P ranks form P / U groups of U
  // consecutive ranks; an all-to-all inside each group trades sequence for heads and the
  // ring runs across the groups. 1: the ring alone; 0: the split the cost model picks for
  // this shape and the ranks per node.
  int ulysses = 1;
  // Attention sinks (docs/SEMANTICS.md): a learned logit per query head joins every row's
  // softmax normaliser and attends no value (gpt-oss, StreamingLLM). With sinks, forward and
  // backward take the logits [H] (fp32, in the memory of the other tensors; -inf: no sink for
  // that head) and backward writes their gradient [H] through this rank's rows (summed over the
  // batch): like any parameter every rank holds, the job's gradient is the sum over the ranks.
  // Dense and block-sparse attention; dilated refuses them (one softmax per pattern).
  bool sinks = false;
  // Progress (called with steps done and steps in the call by the thread driving the ring);
  // cheap, must not throw. May be empty.
  std::function<void(int done, int steps)> on_step;
};

// Who takes part in a job. Comm::single() is one process; mpi_comm() (ringattn/mpi.hpp)
// wraps an MPI communicator. A Comm is a handle: copies share the communicator, which must
// outlive every Engine made on it.
class Comm {
 public:
  static Comm single();
  // Wraps a communicator the caller keeps alive (front ends: virtual ranks, tests).
  static Comm borrow(ring::Communicator& comm);
  explicit Comm(std::shared_ptr<ring::Communicator> comm);

  int rank() const;
  int size() const;
  ring::Communicator& communicator() const { return *comm_; }

 private:
  std::shared_ptr<ring::Communicator> comm_;
};

// A tensor the caller owns. q, k, v and dout are read in the engine's dtype(); out, lse and
// the gradients are fp32. Device tensors must be on the engine's GPU; work on them is
// ordered after everything already queued on `stream` (a cudaStream_t; null: the legacy
// default stream) and the results are ready for later work on that stream.
enum class Memory { host, device };
struct TensorRef {
  void* data = nullptr;
  DeviceDType dtype = DeviceDType::fp32;
  Memory memory = Memory::host;
  void* stream = nullptr;
};

// One pass's figures on this rank, from the last call.
struct PassStats {
  double compute_ms = 0;       // kernels, packing and unpacking
  double comm_ms = 0;          // from posting each exchange to its completion, summed
  double comm_exposed_ms = 0;  // time compute stood waiting for a transfer
  int64_t bytes_sent = 0;      // payload this rank sent
};

// What an engine is and what it did, on this rank (no collective: reduce across ranks
// yourself where you need a job-wide figure).
struct EngineStats {
  std::string engine;         // Plan, RingPlan, SparsePlan, CudaPlan, CudaRingPlan, CudaSparsePlan
  std::string device;         // "cpu" or "cuda"
  std::string device_detail;  // the GPU's name and kernel; empty on the CPU
  bool emulated_device = false;
  std::string kernel;           // cpu | native | cudnn | hopper: the forward's
  std::string kernel_backward;  // the backward's (cuDNN's may differ, or be refused)
  DeviceDType dtype = DeviceDType::fp32;
  int threads = 1;  // CPU threads per rank
  int world_size = 1;
  std::string layout;    // contiguous | zigzag | balanced
  double imbalance = 1;  // max / mean attended pairs over ranks
  double attended_pairs = 0;
  std::size_t workspace_bytes = 0;
  std::size_t workspace_bytes_per_thread = 0;  // single-process CPU plan
  std::size_t device_workspace_bytes = 0;
  std::size_t device_peak_bytes = 0;  // ringattn's device memory high-water mark
  int64_t bytes_sent = 0;             // last forward's payload (the ring's, and the a2a's)
  int64_t bytes_sent_min = 0;         // the computed minimum for this rank, in the same dtype
  int ulysses = 1;                    // U of a Ulysses x ring job
  bool deterministic = false;         // JobSpec::deterministic
  int64_t bytes_sent_a2a = 0;         // of bytes_sent: the Ulysses all-to-alls
  int64_t bytes_sent_a2a_min = 0;     // and their computed minimum
  PassStats forward, backward;
  double comm_exposed_ms = 0;  // forward's, for convenience
  // Block-sparse jobs.
  std::string pattern;  // canonical pattern, or the mask's name
  double sparsity = -1;
  int peers = 0;
  std::string attention_note;      // what attention = auto decided
  std::vector<std::string> notes;  // fallbacks and choices worth printing once
};

class Engine {
 public:
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  // The job as resolved: attention kind after `auto`, shape, layout.
  const AttentionConfig& config() const noexcept;
  Device device() const noexcept;      // cpu or cuda
  DeviceDType dtype() const noexcept;  // what the kernels read q, k, v, dout in
  int rank() const noexcept;
  int world_size() const noexcept;

  // The global sequence positions this rank holds, in local order (zigzag and balanced
  // layouts included); rows_of(r) the same for rank r.
  std::vector<int64_t> local_rows() const;
  std::vector<int64_t> rows_of(int rank) const;
  int64_t local_len() const noexcept;
  // [B, local_len, H, D] and [B, local_len, HKV, D] (logical shapes; config().layout says
  // how they sit in memory). lse is [B, H, local_len].
  Shape4 local_shape() const noexcept;
  Shape4 local_kv_shape() const noexcept;

  // This rank's float32 host shard. On a GPU engine the first host call allocates staging
  // buffers on the device once; the call returns when the results are on the host. `sinks`
  // and `dsinks` ([H]) are given exactly when JobSpec::sinks is set.
  void forward(const float* q, const float* k, const float* v, float* out, float* lse,
               const float* sinks = nullptr);
  void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv, const float* sinks = nullptr,
                float* dsinks = nullptr);
  // Tensor references: host tensors as above; device tensors enqueue on their stream.
  void forward(const TensorRef& q, const TensorRef& k, const TensorRef& v, const TensorRef& out,
               const TensorRef& lse, const TensorRef& sinks = {});
  void backward(const TensorRef& q, const TensorRef& k, const TensorRef& v, const TensorRef& out,
                const TensorRef& lse, const TensorRef& dout, const TensorRef& dq,
                const TensorRef& dk, const TensorRef& dv, const TensorRef& sinks = {},
                const TensorRef& dsinks = {});
  // Waits until the engine's device work is done (a no-op on the CPU).
  void synchronize();

  EngineStats stats() const;

  struct Impl;
  // Front ends of this repository only (the CLI's float64 check needs the block lists).
  const Impl& impl() const noexcept { return *impl_; }

 private:
  friend Engine make_engine(const JobSpec& spec, Comm& comm);
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Resolves, validates, lays out, plans and allocates. Every rank of `comm` calls it
// together; a setup error on any rank is thrown on every rank (the lowest failing rank's
// error, with its rank() naming that rank), so no rank is left waiting. InputError::subject()
// names the field at fault in the CLI's spelling ("--segments", "--seq-len"); front ends
// translate it (field_of below).
Engine make_engine(const JobSpec& spec, Comm& comm);

// The global sequence positions `rank` holds, in local order, when `spec` runs on `world`
// ranks: what each rank passes to Engine::forward (zigzag for causal jobs, whole blocks for
// block-sparse), known before any engine exists. Equal to Engine::local_rows().
std::vector<int64_t> shard_rows(const JobSpec& spec, int world, int rank);

// The JobSpec field an InputError subject names: "--seq-len" -> "config.shape.seq_len",
// "--segments" -> "config.segments"; the subject itself when it names no field (a file).
std::string field_of(const std::string& subject);

}  // namespace ringattn
