// Exchanges of a device communicator ordered against one compute stream, with no host
// synchronisation until the call ends (the GPU ring, cuda_ring_engine.cpp, and distributed
// block-sparse on GPUs, sparse/cuda_sparse_plan.cpp). An exchange is posted through the
// communication thread to start after an event of the compute stream (its send buffer is
// written, its receive buffer no longer read); the compute stream waits for the exchange's
// own event before it reads what arrived, and that wait is bracketed by timing events, which
// measure how long the stream stood still (the exposed communication).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/progress_thread.hpp"
#include "ring/ring_engine.hpp"

namespace ringattn::ring {

class StreamExchanges {
 public:
  // `stream` (owned by the caller, outliving this) on `device`; with one rank there is no
  // communication thread and post() must not be called. `skip_ordering` drops the events
  // exchanges wait for (RingOptions::skip_buffer_ordering_for_tests).
  StreamExchanges(Communicator& comm, cudaStream_t stream, int device, double timeout_s,
                  bool skip_ordering);
  ~StreamExchanges();
  StreamExchanges(const StreamExchanges&) = delete;
  StreamExchanges& operator=(const StreamExchanges&) = delete;

  // Begins a call: records its first event on the stream.
  void start_call();
  // Posts an exchange to start once the compute stream's work so far is done; returns its
  // ticket (-1 when both lists are empty).
  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag, int step,
           const char* what);
  // The compute stream waits, on the device, for exchange `ticket` (-1: nothing to wait for).
  void device_wait(int ticket);
  // Ends a call: with several ranks, waits on the host for each exchange of the call and the
  // stream, and sets tm's comm_ms, exposed_ms and compute_ms (the stream's time from the
  // first event less the waits); with one rank only records the last event.
  void finish_call(RingTimings& tm);

 private:
  cudaEvent_t fresh_event();

  Communicator& comm_;
  cudaStream_t stream_;
  int device_;
  bool skip_ordering_;
  std::unique_ptr<ProgressThread> progress_;
  std::vector<cudaEvent_t> sync_events_;  // each used once per call (see fresh_event)
  std::size_t next_event_ = 0;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> waits_;  // around each stream wait
  std::size_t next_wait_ = 0;
  std::vector<int> open_tickets_;  // exchanges of this call not yet waited for
};

}  // namespace ringattn::ring
