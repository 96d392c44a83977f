// Virtual ranks on fewer GPUs than ranks (one GPU for a whole ring, as a developer has):
// NCCL refuses two ranks of one communicator on one device, so this device communicator
// moves the ring's device buffers with cudaMemcpyAsync between the ranks' own streams.
// A send records a "ready" event on the sender's communication stream (after the compute
// event stream_wait() named) and is posted to a hub the ranks share; the receiver, when its
// test() matches it (same source, tag, issue order), makes its stream wait for that event,
// copies, and records a "copied" event; the sender's exchange ends on its stream after
// every copy of its sends, so a send buffer is free once the exchange's event completes.
// Collectives, abort and the watchdog's hooks go to the in-process control communicator.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"
#include "ring/nccl_communicator.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace {

struct Post {
  const void* data = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t ready = nullptr;   // on the sender's stream: the data is there
  cudaEvent_t copied = nullptr;  // on the receiver's stream: it has been copied (once set)
  bool matched = false;          // guarded by the hub's mutex
  ~Post() {
    if (ready) (void)cudaEventDestroy(ready);
    if (copied) (void)cudaEventDestroy(copied);
  }
};

struct Hub {
  std::mutex mu;
  // Unmatched sends by (source, destination, tag), oldest first.
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<Post>>> queues;
};

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  RINGATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

class DeviceInprocCommunicator;

class DeviceInprocExchange final : public PendingExchange {
 public:
  struct Recv {
    int src;
    void* data;
    std::size_t bytes;
    std::shared_ptr<Post> post;
  };
  DeviceInprocExchange(DeviceInprocCommunicator& c, int tag) : c_(c), tag_(tag) {}
  ~DeviceInprocExchange() override;
  bool test() override;
  void* device_event() const override { return done_; }

  std::vector<std::pair<int, std::shared_ptr<Post>>> sends;  // (destination, post)
  std::vector<Recv> recvs;

 private:
  DeviceInprocCommunicator& c_;
  int tag_;
  std::vector<bool> waited_;  // per send: the stream waits for its copy
  cudaEvent_t done_ = nullptr;
};

class DeviceInprocCommunicator final : public Communicator {
 public:
  DeviceInprocCommunicator(Communicator& control, int device, std::shared_ptr<Hub> hub)
      : control_(control), device_(device), hub_(std::move(hub)) {
    const kernels::cuda::ScopedDevice on(device_);
    RINGATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~DeviceInprocCommunicator() override {
    const kernels::cuda::ScopedDevice on(device_, std::nothrow);
    if (stream_) {
      // Not after the watchdog fired: its copies may wait on the hung kernel.
      if (!kernels::cuda::device_stuck()) (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }

  int rank() const override { return control_.rank(); }
  int size() const override { return control_.size(); }
  int local_rank() const override { return control_.local_rank(); }
  std::string library_version() const override {
    return "in-process device copies (cudaMemcpyAsync) on " + describe_cuda_device(device_) +
           " (control: " + control_.library_version() + ")";
  }
  MemorySpace memory_space() const override { return MemorySpace::device; }
  void stream_wait(void* cuda_event) override {
    const kernels::cuda::ScopedDevice on(device_);
    RINGATTN_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(cuda_event), 0));
  }

  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int tag) override {
    const kernels::cuda::ScopedDevice on(device_);
    auto ex = std::make_unique<DeviceInprocExchange>(*this, tag);
    for (const Transfer& t : sends) {
      auto post = std::make_shared<Post>();
      post->data = t.data;
      post->bytes = t.bytes;
      post->ready = new_event();
      RINGATTN_CUDA_CHECK(cudaEventRecord(post->ready, stream_));
      {
        std::lock_guard lock(hub_->mu);
        hub_->queues[{rank(), t.peer, tag}].push_back(post);
      }
      ex->sends.emplace_back(t.peer, std::move(post));
    }
    for (const Transfer& t : recvs) ex->recvs.push_back({t.peer, t.data, t.bytes, nullptr});
    return ex;
  }

  // The oldest unmatched send from `src` to this rank with `tag`, or null.
  std::shared_ptr<Post> match(int src, int tag) {
    std::lock_guard lock(hub_->mu);
    auto it = hub_->queues.find({src, rank(), tag});
    if (it == hub_->queues.end() || it->second.empty()) return nullptr;
    auto post = it->second.front();
    it->second.pop_front();
    post->matched = true;
    return post;
  }
  // Whether the receiver has enqueued its copy of `post` (then post->copied is recorded).
  bool copy_enqueued(const Post& post) {
    std::lock_guard lock(hub_->mu);
    return post.copied != nullptr;
  }
  void set_copied(Post& post, cudaEvent_t e) {
    std::lock_guard lock(hub_->mu);
    post.copied = e;
  }
  // An unmatched send leaves the hub (its exchange was abandoned).
  void withdraw(int dst, int tag, const std::shared_ptr<Post>& post) {
    std::lock_guard lock(hub_->mu);
    auto& q = hub_->queues[{rank(), dst, tag}];
    for (auto it = q.begin(); it != q.end(); ++it)
      if (*it == post) {
        q.erase(it);
        return;
      }
  }

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
  void check_aborted() override { control_.check_aborted(); }
  [[noreturn]] void abort(int exit_code) override {
    control_.abort(exit_code);
    std::_Exit(exit_code);  // not reached: control_.abort ends the job
  }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  Communicator& control_;
  int device_;
  std::shared_ptr<Hub> hub_;
  cudaStream_t stream_ = nullptr;
};

bool DeviceInprocExchange::test() {
  c_.check_aborted();
  const kernels::cuda::ScopedDevice on(c_.device());
  if (!done_) {
    bool all = true;
    // Receives from one source match its sends in issue order: once one finds nothing, the
    // later ones from that source wait for the next test() (the sender may post between
    // them, and a later receive must not take the earlier send).
    std::vector<int> unmatched_sources;
    for (Recv& r : recvs) {
      if (r.post) continue;
      if (std::find(unmatched_sources.begin(), unmatched_sources.end(), r.src) !=
          unmatched_sources.end())
        continue;
      r.post = c_.match(r.src, tag_);
      if (!r.post) {
        all = false;
        unmatched_sources.push_back(r.src);
        continue;
      }
      if (r.post->bytes != r.bytes)
        throw RuntimeFailure("rank " + std::to_string(c_.rank()) + ": message from rank " +
                             std::to_string(r.src) + " with tag " + std::to_string(tag_) + " has " +
                             std::to_string(r.post->bytes) + " bytes, expected " +
                             std::to_string(r.bytes));
      RINGATTN_CUDA_CHECK(cudaStreamWaitEvent(c_.stream(), r.post->ready, 0));
      RINGATTN_CUDA_CHECK(
          cudaMemcpyAsync(r.data, r.post->data, r.bytes, cudaMemcpyDefault, c_.stream()));
      cudaEvent_t copied = new_event();
      RINGATTN_CUDA_CHECK(cudaEventRecord(copied, c_.stream()));
      c_.set_copied(*r.post, copied);
    }
    waited_.resize(sends.size(), false);
    for (std::size_t i = 0; i < sends.size(); ++i) {
      if (waited_[i]) continue;
      if (!c_.copy_enqueued(*sends[i].second)) {
        all = false;
        continue;
      }
      RINGATTN_CUDA_CHECK(cudaStreamWaitEvent(c_.stream(), sends[i].second->copied, 0));
      waited_[i] = true;
    }
    if (!all) return false;
    done_ = new_event();
    RINGATTN_CUDA_CHECK(cudaEventRecord(done_, c_.stream()));
  }
  const cudaError_t rc = cudaEventQuery(done_);
  if (rc == cudaErrorNotReady) return false;
  RINGATTN_CUDA_CHECK(rc);
  return true;
}

DeviceInprocExchange::~DeviceInprocExchange() {
  const kernels::cuda::ScopedDevice on(c_.device(), std::nothrow);
  // Abandoned (the job is ending): sends nobody took leave the hub; copies already enqueued
  // finish before the buffers they touch can go away.
  for (const auto& [dst, post] : sends)
    if (!post->matched) c_.withdraw(dst, tag_, post);
  if (!kernels::cuda::device_stuck()) (void)cudaStreamSynchronize(c_.stream());
  if (done_) (void)cudaEventDestroy(done_);
}

}  // namespace

std::unique_ptr<Communicator> make_device_inproc_communicator(Communicator& control, int device) {
  // Rank 0 makes the hub; its address travels over the in-process control communicator.
  std::shared_ptr<Hub> hub;
  std::shared_ptr<Hub>* holder = nullptr;
  if (control.rank() == 0) holder = new std::shared_ptr<Hub>(std::make_shared<Hub>());
  control.broadcast(&holder, sizeof holder, 0);
  hub = *holder;
  control.barrier();  // every rank holds its reference before rank 0 drops the holder
  if (control.rank() == 0) delete holder;
  return std::make_unique<DeviceInprocCommunicator>(control, device, std::move(hub));
}

}  // namespace ringattn::ring
