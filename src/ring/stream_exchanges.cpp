// StreamExchanges (see stream_exchanges.hpp).
#include "ring/stream_exchanges.hpp"

#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

StreamExchanges::StreamExchanges(Communicator& comm, cudaStream_t stream, int device,
                                 double timeout_s, bool skip_ordering)
    : comm_(comm), stream_(stream), device_(device), skip_ordering_(skip_ordering) {
  const kc::ScopedDevice on(device_);
  RINGATTN_CUDA_CHECK(cudaEventCreate(&begin_));
  RINGATTN_CUDA_CHECK(cudaEventCreate(&end_));
  if (comm.size() > 1) progress_ = std::make_unique<ProgressThread>(comm, timeout_s);
}

StreamExchanges::~StreamExchanges() {
  const kc::ScopedDevice on(device_, std::nothrow);
  progress_.reset();
  if (!kc::device_stuck()) (void)cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : sync_events_) (void)cudaEventDestroy(e);
  for (auto [a, b] : waits_) (void)cudaEventDestroy(a), (void)cudaEventDestroy(b);
  if (begin_) (void)cudaEventDestroy(begin_);
  if (end_) (void)cudaEventDestroy(end_);
}

// A fresh event for this call: the communication thread calls stream_wait() on it at some
// later moment, so it must not be recorded again within the call.
cudaEvent_t StreamExchanges::fresh_event() {
  if (next_event_ == sync_events_.size()) {
    cudaEvent_t e = nullptr;
    RINGATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    sync_events_.push_back(e);
  }
  return sync_events_[next_event_++];
}

void StreamExchanges::start_call() {
  next_event_ = 0;
  next_wait_ = 0;
  open_tickets_.clear();
  RINGATTN_CUDA_CHECK(cudaEventRecord(begin_, stream_));
}

int StreamExchanges::post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag,
                          int step, const char* what) {
  if (sends.empty() && recvs.empty()) return -1;
  cudaEvent_t after = nullptr;
  if (!skip_ordering_) {
    after = fresh_event();
    RINGATTN_CUDA_CHECK(cudaEventRecord(after, stream_));
  }
  const int ticket =
      progress_->post_after(after, std::move(sends), std::move(recvs), tag, step, what);
  open_tickets_.push_back(ticket);
  return ticket;
}

void StreamExchanges::device_wait(int ticket) {
  if (ticket < 0) return;
  if (next_wait_ == waits_.size()) {
    cudaEvent_t a = nullptr, b = nullptr;
    RINGATTN_CUDA_CHECK(cudaEventCreate(&a));
    RINGATTN_CUDA_CHECK(cudaEventCreate(&b));
    waits_.emplace_back(a, b);
  }
  auto [before, after] = waits_[next_wait_++];
  progress_->when_enqueued(ticket, [&](void* done) {
    RINGATTN_CUDA_CHECK(cudaEventRecord(before, stream_));
    if (done) RINGATTN_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(done), 0));
    RINGATTN_CUDA_CHECK(cudaEventRecord(after, stream_));
  });
}

void StreamExchanges::finish_call(RingTimings& tm) {
  RINGATTN_CUDA_CHECK(cudaEventRecord(end_, stream_));
  if (!progress_) return;
  for (int ticket : open_tickets_) tm.comm_ms += progress_->wait(ticket);
  open_tickets_.clear();
  kc::wait_for_event(end_, stream_, "the ring's pass");
  float ms = 0;
  RINGATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, begin_, end_));
  double exposed = 0;
  for (std::size_t i = 0; i < next_wait_; ++i) {
    float w = 0;
    RINGATTN_CUDA_CHECK(cudaEventElapsedTime(&w, waits_[i].first, waits_[i].second));
    exposed += w;
  }
  tm.exposed_ms = exposed;
  tm.compute_ms = ms - exposed;
}

}  // namespace ringattn::ring
