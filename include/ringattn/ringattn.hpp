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
#include "ringattn/errors.hpp"
#include "ringattn/stats.hpp"
#include "ringattn/transport.hpp"
#include "ringattn/types.hpp"

namespace ringattn {

// Where a block-sparse job's (query block, key block) lists come from: the --pattern
// language (docs/SEMANTICS.md), or an explicit bool mask [H, nb, nb] or [nb, nb] (nb = N /
// block size, C order). `mask_name` is how reports name the mask ("--block-mask (m.npy)",
// "block_mask"); errors about it name the field `block_sparse.mask`.
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
  // computes in fp32 (anything else is refused, naming `dtype`).
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
  double timeout_s = 300;  // watchdog: longest wait for one exchange, collective or GPU kernel
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
// wraps an MPI communicator, mpi_world() starts MPI itself; from_transport() runs over a
// transport the caller brings (ringattn/transport.hpp); run_virtual_ranks() makes the ranks
// threads of this process. A Comm is a handle: copies share the communicator, which lives
// while any copy or Engine made on it does.
class Comm {
 public:
  static Comm single();
  static Comm from_transport(std::shared_ptr<HostTransport> transport);

  int rank() const;
  int size() const;
  int local_rank() const;           // rank among the ranks of this node
  std::string description() const;  // the library underneath, e.g. "Open MPI v4.1.4"

  // Host collectives for a front end's own steps around the engine (reports, checks): every
  // rank calls them together, in the same order. (Const: a Comm is a handle.) They give up after
  // set_timeout() seconds (default 300), throwing RuntimeFailure, where the transport can wait for
  // a dead peer.
  void set_timeout(double seconds) const;
  void barrier() const;
  int64_t max(int64_t v) const;
  double max(double v) const;
  // `bytes` from every rank to rank 0, rank-major into `out` (which only rank 0 needs).
  void gather(const void* data, std::size_t bytes, void* out) const;
  // Every rank's `mine` on rank 0, in rank order (empty elsewhere).
  std::vector<std::string> gather(const std::string& mine) const;
  // `bytes` at `data` on rank `root` to `data` on every rank.
  void broadcast(void* data, std::size_t bytes, int root) const;
  // Runs `f` on every rank; if it throws on any, throws on every rank the lowest failing
  // rank's error (InputError or RuntimeFailure, with rank() naming that rank), so that no
  // rank is left waiting in a later collective. make_engine agrees on its errors this way.
  void agree(const std::function<void()>& f) const;
  // Ends every rank of the job now with `exit_code` (a failing rank must not leave the others
  // waiting): MPI_Abort under MPI, every virtual rank of the process, this process otherwise.
  [[noreturn]] void abort(int exit_code) const;
  // Virtual ranks: returns quietly unless another rank of the job has aborted, and ends this
  // one if it has (call it before reporting an error that may be the abort's echo).
  void check_aborted() const;

 private:
  friend struct CommAccess;  // the library's own access to the communicator underneath
  struct Impl;
  Comm() = default;  // every Comm holds a communicator: made only by the factories above
  std::shared_ptr<Impl> impl_;
};

// Runs `body` on `ranks` virtual ranks: the ranks of one job as threads of this process, each
// with its own Comm (rank r of `ranks`), exchanging through shared memory (device copies on
// GPUs they share). Returns the job's exit code: the first abort's if any rank called
// Comm::abort, else the largest code a rank returned. A std::exception escaping `body` is
// printed naming the rank and aborts the job with exit 3. OpenMP settings are per thread:
// `body` chooses its own thread count.
int run_virtual_ranks(int ranks, const std::function<int(Comm&)>& body);

// True when an MPI launcher (mpirun, mpiexec, srun with PMI) started this process.
bool launched_by_mpi();

// MPI_COMM_WORLD as a Comm, with MPI initialised here (thread level MULTIPLE, argc/argv may
// be null) and finalised when the last copy of the Comm is gone. Throws RuntimeFailure in a
// build without MPI.
Comm mpi_world(int* argc = nullptr, char*** argv = nullptr);

// What this build of the library has.
struct BuildFeatures {
  bool cuda = false;  // CUDA kernels (--device cuda); cuda_built() in ringattn/device.hpp
  bool nccl = false;  // the NCCL transport
  bool mpi = false;   // MPI (mpi_comm, mpi_world)
};
BuildFeatures build_features() noexcept;

// NCCL is not linked: the NCCL transport opens it when first made, taking the NCCL already in
// the process if there is one (PyTorch's, say), else this file if one was set here, else
// libnccl.so.2 by the dynamic loader's search, else the one found when ringattn was built.
// Call before the first NCCL job; no effect after it, or in a build without NCCL.
void set_nccl_library(const std::string& path);
// The NCCL in use, opening it as a first NCCL job would: "NCCL 2.28.9 (<its file>)", or why
// it cannot be opened ("NCCL (not loaded: ...)"), or "none (built without NCCL)".
std::string nccl_version();

// A tensor the caller owns. q, k, v and dout are read in the engine's dtype(); out, lse and
// the gradients are fp32. Device tensors must be on the engine's GPU; work on them is
// ordered after everything already queued on `stream` (a cudaStream_t; null: the legacy
// default stream) and the results are ready for later work on that stream.
struct TensorRef {
  void* data = nullptr;
  DeviceDType dtype = DeviceDType::fp32;
  Memory memory = Memory::host;
  void* stream = nullptr;
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
  // [B, local_len, H, D] (q, dq) and [B, local_len, HKV, D] (k, dk) (logical shapes;
  // config().layout says how they sit in memory). lse is [B, H, local_len]. v and dv are
  // local_v_shape() [B, local_len, HKV, Dv], out and dout local_out_shape() [B, local_len, H,
  // Dv], Dv = config().effective_head_dim_v().
  Shape4 local_shape() const noexcept;
  Shape4 local_kv_shape() const noexcept;
  Shape4 local_v_shape() const noexcept;
  Shape4 local_out_shape() const noexcept;

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

  // The GPU a cuda engine computes on (-1 on the CPU).
  int device_index() const noexcept;

  // Block-sparse jobs (config().attention == block_sparse): the key blocks that query block
  // `query_block` of head `head` attends, ascending (blocks of config().block_size positions,
  // over the whole sequence); and the same lists as a dense bool mask [heads, nb, nb], nb =
  // seq_len / block_size (for small N). Empty for other jobs.
  std::vector<int64_t> key_blocks(int64_t head, int64_t query_block) const;
  std::vector<uint8_t> block_mask() const;

 private:
  struct Impl;
  friend Engine make_engine(const JobSpec& spec, Comm& comm);
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Resolves, validates, lays out, plans and allocates. Every rank of `comm` calls it
// together; a setup error on any rank is thrown on every rank (the lowest failing rank's
// error, with its rank() naming that rank), so no rank is left waiting. InputError::subject()
// names the JobSpec field at fault as C++ code reaches it from the JobSpec ("config.segments",
// "config.shape.seq_len"; errors.hpp); a front end says it in its own words.
Engine make_engine(const JobSpec& spec, Comm& comm);

// The global sequence positions `rank` holds, in local order, when `spec` runs on `world`
// ranks: what each rank passes to Engine::forward (zigzag for causal jobs, whole blocks for
// block-sparse), known before any engine exists. Equal to Engine::local_rows().
std::vector<int64_t> shard_rows(const JobSpec& spec, int world, int rank);

}  // namespace ringattn
