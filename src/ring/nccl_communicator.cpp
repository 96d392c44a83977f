// NCCL behind the Communicator interface. Everything NCCL does here is nonblocking: init,
// group end and finalize return ncclInProgress and are polled (ncclCommGetAsyncError) by
// the communication thread, so the watchdog can always act: cancel_in_flight() aborts the
// communicator (ncclCommAbort) and reports ncclGetLastError. One step is one NCCL group, so
// the sends and receives of a step cannot deadlock against each other's ordering. Every NCCL
// call goes through the table nccl_library.hpp opens on first use (ringattn links no NCCL).
#include "ring/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cuda/runtime/cuda_check.hpp"
#include "ring/nccl_library.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::ring {

namespace {

[[noreturn]] void nccl_fail(const NcclLibrary& nccl, ncclResult_t rc, ncclComm_t comm, int rank,
                            const char* what, const char* file, int line) {
  const char* last = nccl.ncclGetLastError(comm);
  throw RuntimeFailure(std::string(file) + ":" + std::to_string(line) + ": rank " +
                       std::to_string(rank) + ": " + what +
                       " failed: " + nccl.ncclGetErrorString(rc) +
                       (last && *last ? std::string(" (NCCL: ") + last + ")" : std::string()));
}

[[noreturn]] void cuda_fail(cudaError_t rc, int rank, const char* what, const char* file,
                            int line) {
  throw RuntimeFailure(std::string(file) + ":" + std::to_string(line) + ": rank " +
                       std::to_string(rank) + ": " + what + " failed: " + cudaGetErrorName(rc) +
                       ": " + cudaGetErrorString(rc));
}

}  // namespace

// Both need `rank_` in scope; NCCL_CHECK also `comm_` (may be null) and `nccl_` (the table),
// and is written RINGATTN_NCCL_CHECK(ncclSend, args...): the call through the table, named in
// the message as NCCL's own (`ncclSend(args...) failed: ...`).
#define RINGATTN_NCCL_CHECK(fn, ...)                                                            \
  do {                                                                                          \
    const ncclResult_t rc_ = nccl_.fn(__VA_ARGS__);                                             \
    if (rc_ != ncclSuccess && rc_ != ncclInProgress)                                            \
      ::ringattn::ring::nccl_fail(nccl_, rc_, comm_, rank_, #fn "(" #__VA_ARGS__ ")", __FILE__, \
                                  __LINE__);                                                    \
  } while (0)
#define RINGATTN_NCCL_CUDA_CHECK(call)                                                          \
  do {                                                                                          \
    const cudaError_t rc_ = (call);                                                             \
    if (rc_ != cudaSuccess) ::ringattn::ring::cuda_fail(rc_, rank_, #call, __FILE__, __LINE__); \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator;

class NcclExchange final : public PendingExchange {
 public:
  NcclExchange(NcclCommunicator& c, cudaEvent_t ev, bool enqueued)
      : c_(c), event_(ev), enqueued_(enqueued) {}
  ~NcclExchange() override;
  bool test() override;
  void* device_event() const override { return enqueued_ ? event_ : nullptr; }

 private:
  NcclCommunicator& c_;
  cudaEvent_t event_;
  bool enqueued_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& control, const NcclOptions& opts)
      : control_(control), rank_(control.rank()), timeout_s_(opts.timeout_s) {
    int count = 0;
    RINGATTN_NCCL_CUDA_CHECK(cudaGetDeviceCount(&count));
    const int local = control.local_rank();
    // One visible GPU: the launcher bound this rank to it (CUDA_VISIBLE_DEVICES per task).
    if (count == 1)
      device_ = 0;
    else if (local < count)
      device_ = local;
    else
      throw RuntimeFailure("rank " + std::to_string(rank_) + ": node-local rank " +
                           std::to_string(local) + " but only " + std::to_string(count) +
                           " visible GPUs; NCCL refuses two ranks on one GPU (start at most one "
                           "rank per GPU, or use " +
                           field_is("transport", "local") + " for virtual ranks on one GPU)");
    RINGATTN_NCCL_CUDA_CHECK(cudaSetDevice(device_));
    RINGATTN_NCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) RINGATTN_NCCL_CHECK(ncclGetUniqueId, &id);
    control.broadcast(&id, sizeof id, 0);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    RINGATTN_NCCL_CHECK(ncclCommInitRankConfig, &comm_, control.size(), id, rank_, &config);
    wait_until_idle("ncclCommInitRankConfig");
  }

  ~NcclCommunicator() override {
    const kernels::cuda::ScopedDevice on(device_, std::nothrow);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (comm_ && !aborted_.load()) {
      // Finalize flushes outstanding work; if that fails or cannot finish in time, abort.
      bool clean = true;
      try {
        RINGATTN_NCCL_CHECK(ncclCommFinalize, comm_);
        wait_until_idle("ncclCommFinalize");  // aborts by itself past the timeout
      } catch (const std::exception&) {
        clean = false;
      }
      if (clean)
        nccl_.ncclCommDestroy(comm_);
      else if (!aborted_.exchange(true))
        nccl_.ncclCommAbort(comm_);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return control_.size(); }
  int local_rank() const override { return control_.local_rank(); }
  std::string library_version() const override {
    return nccl_version_string() + " on " + describe_cuda_device(device_) +
           " (control: " + control_.library_version() + ")";
  }
  MemorySpace memory_space() const override { return MemorySpace::device; }
  void stream_wait(void* cuda_event) override {
    const kernels::cuda::ScopedDevice on(device_);
    RINGATTN_NCCL_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(cuda_event), 0));
  }

  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int) override {
    // Called on the ring's progress thread, whose current device may be another GPU.
    const kernels::cuda::ScopedDevice on(device_);
    // Tags are not needed: NCCL matches sends and receives between a pair of ranks in
    // issue order, and both sides issue the ring's exchanges in the same order.
    RINGATTN_NCCL_CHECK(ncclGroupStart);
    for (const Transfer& t : recvs)
      RINGATTN_NCCL_CHECK(ncclRecv, t.data, t.bytes, ncclUint8, t.peer, comm_, stream_);
    for (const Transfer& t : sends)
      RINGATTN_NCCL_CHECK(ncclSend, t.data, t.bytes, ncclUint8, t.peer, comm_, stream_);
    const ncclResult_t end = nccl_.ncclGroupEnd();
    if (end != ncclSuccess && end != ncclInProgress)
      nccl_fail(nccl_, end, comm_, rank_, "ncclGroupEnd", __FILE__, __LINE__);
    cudaEvent_t ev = take_event();
    const bool enqueued = end == ncclSuccess;
    if (enqueued) RINGATTN_NCCL_CUDA_CHECK(cudaEventRecord(ev, stream_));
    return std::make_unique<NcclExchange>(*this, ev, enqueued);
  }

  // ncclInProgress while a nonblocking call is still being carried out; throws on an error.
  bool busy() {
    ncclResult_t state = ncclSuccess;
    RINGATTN_NCCL_CHECK(ncclCommGetAsyncError, comm_, &state);
    if (state == ncclInProgress) return true;
    if (state != ncclSuccess)
      nccl_fail(nccl_, state, comm_, rank_, "asynchronous NCCL operation", __FILE__, __LINE__);
    return false;
  }
  void record(cudaEvent_t ev) {
    const kernels::cuda::ScopedDevice on(device_);
    RINGATTN_NCCL_CUDA_CHECK(cudaEventRecord(ev, stream_));
  }
  bool query(cudaEvent_t ev) {
    const kernels::cuda::ScopedDevice on(device_);
    const cudaError_t rc = cudaEventQuery(ev);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) cuda_fail(rc, rank_, "cudaEventQuery", __FILE__, __LINE__);
    busy();  // surfaces a failed transfer (network error, peer abort) instead of waiting
    return false;
  }
  void give_back(cudaEvent_t ev) { free_events_.push_back(ev); }

  void barrier() override { control_.barrier(); }
  int64_t max(int64_t v) override { return control_.max(v); }
  double max(double v) override { return control_.max(v); }
  void gather(const void* data, std::size_t bytes, void* out) override {
    control_.gather(data, bytes, out);
  }
  std::vector<RankInfo> gather_info(const RankInfo& mine) override {
    return control_.gather_info(mine);
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    control_.broadcast(data, bytes, root);
  }

  // The watchdog calls this from its own thread while the progress thread may be inside
  // NCCL; the first caller aborts, later ones (and abort()) only report.
  std::string cancel_in_flight() override {
    if (aborted_.exchange(true)) return "NCCL communicator already aborted";
    const kernels::cuda::ScopedDevice on(device_, std::nothrow);
    nccl_.ncclCommAbort(comm_);
    // Read after the abort, when the library's account of what was in flight is complete;
    // with a null communicator, since the abort has freed this one (NCCL keeps the last
    // error per process; its manual says the argument may be NULL).
    const char* last = nccl_.ncclGetLastError(nullptr);
    const std::string why = last && *last ? last : "no NCCL error recorded";
    return "NCCL communicator aborted (ncclCommAbort); ncclGetLastError: " + why;
  }
  // Virtual ranks: an abort of the job reaches this rank through its control communicator
  // (a rank stalled outside NCCL polls it).
  void check_aborted() override { control_.check_aborted(); }
  [[noreturn]] void abort(int exit_code) override {
    if (comm_ && !aborted_.exchange(true)) {
      const kernels::cuda::ScopedDevice on(device_, std::nothrow);
      nccl_.ncclCommAbort(comm_);
    }
    control_.abort(exit_code);
    std::_Exit(exit_code);  // not reached: control_.abort ends the job
  }

 private:
  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    RINGATTN_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  // Polls a nonblocking NCCL call to completion; past the timeout, aborts and throws.
  void wait_until_idle(const char* what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    while (busy()) {
      if (Clock::now() > deadline) {
        const std::string reason = cancel_in_flight();
        throw RuntimeFailure("rank " + std::to_string(rank_) + ": " + what +
                             " did not complete within " + std::to_string(timeout_s_) +
                             " s (timeout_s); " + reason);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // First: NCCL is opened (or the reason it cannot be) before anything else is set up.
  const NcclLibrary& nccl_ = nccl_library();
  Communicator& control_;
  int rank_ = 0;
  double timeout_s_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};  // set once, by whichever thread aborts first
  std::vector<cudaEvent_t> free_events_;
};

NcclExchange::~NcclExchange() { c_.give_back(event_); }

bool NcclExchange::test() {
  if (!enqueued_) {
    if (c_.busy()) return false;  // the group is still being issued
    c_.record(event_);
    enqueued_ = true;
  }
  return c_.query(event_);
}

}  // namespace

std::string nccl_version_string() {
  try {
    const NcclLibrary& nccl = nccl_library();
    return nccl_version_name(nccl.version_code) + " (" + nccl.file + ")";
  } catch (const std::exception& e) {
    return std::string("NCCL (not loaded: ") + e.what() + ")";
  }
}

std::string describe_cuda_device(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess)
    return "CUDA device " + std::to_string(device) + " (no properties)";
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) std::strcpy(bus, "unknown");
  return "cuda:" + std::to_string(device) + " " + p.name + " (PCI " + bus + ", sm_" +
         std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.totalGlobalMem >> 20) + " MiB)";
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& control,
                                                     const NcclOptions& opts) {
  return std::make_unique<NcclCommunicator>(control, opts);
}

}  // namespace ringattn::ring
