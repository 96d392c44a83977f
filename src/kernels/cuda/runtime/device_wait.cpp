// The device watchdog (see device_wait.hpp): a journal of each registered stream's launches
// (an event after each, recycled once it has completed) and the polling waits that read it.
#include "kernels/cuda/runtime/device_wait.hpp"

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/environment.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

struct Entry {
  cudaEvent_t event;
  const char* name;
};

struct Journal {
  double timeout_s = kDefaultDeviceTimeoutSeconds;
  std::deque<Entry> entries;  // oldest first; completed ones are dropped from the front
};

// A journal holds at most this many launches not yet seen to complete; older ones are
// forgotten (their events destroyed, which CUDA allows while pending).
constexpr std::size_t kMaxEntries = 1024;

// Streams are per device; the legacy default stream (null) is one per device.
using Key = std::pair<int, cudaStream_t>;

std::mutex g_mu;
std::map<Key, Journal> g_journals;
std::map<int, std::vector<cudaEvent_t>> g_free_events;  // completed, per device
std::vector<std::pair<int, cudaEvent_t>> g_stuck;       // (device, event after the hung work)

int current_device() {
  int d = 0;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

// Drops the journal's completed entries from the front (under g_mu).
void prune(int device, Journal& j) {
  while (!j.entries.empty() && cudaEventQuery(j.entries.front().event) == cudaSuccess) {
    g_free_events[device].push_back(j.entries.front().event);
    j.entries.pop_front();
  }
}

// The first journaled launch on (device, stream) that has not finished, or null.
const char* first_unfinished(int device, cudaStream_t stream) {
  std::lock_guard lock(g_mu);
  const auto it = g_journals.find({device, stream});
  if (it == g_journals.end()) return nullptr;
  for (const Entry& e : it->second.entries)
    if (cudaEventQuery(e.event) != cudaSuccess) return e.name;
  return nullptr;
}

[[noreturn]] void hang(int device, cudaStream_t stream, const char* what, double timeout_s) {
  // Keep an event after the hung work: device_stuck() holds until it completes.
  cudaEvent_t after = nullptr;
  if (cudaEventCreateWithFlags(&after, cudaEventDisableTiming) == cudaSuccess &&
      cudaEventRecord(after, stream) == cudaSuccess) {
    std::lock_guard lock(g_mu);
    g_stuck.emplace_back(device, after);
  }
  (void)cudaGetLastError();
  const char* kernel = first_unfinished(device, stream);
  std::ostringstream os;
  os << "the GPU (device " << device << ") did not finish "
     << (kernel ? kernel : "the work enqueued before it (none of ringattn's journaled kernels)")
     << " within " << timeout_s << " s, waiting for " << what
     << " (the watchdog's timeout: timeout_s); a kernel that never "
        "finishes leaves the device running it, so this process must end";
  throw DeviceHang(os.str());
}

// A query's answer: finished, not yet, or (thrown) the fault the work met.
bool finished(cudaError_t e, const char* query) {
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) throw_cuda_error(e, query, __FILE__, __LINE__);
  return false;
}

// Polls `done()` (true: finished; throws on a fault) until `timeout_s` has passed: spins
// briefly, then sleeps with a growing interval up to a millisecond.
template <class Done>
void poll(Done&& done, int device, cudaStream_t stream, const char* what, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s);
  auto nap = std::chrono::microseconds(0);
  for (int i = 0;; ++i) {
    if (done()) return;
    if (Clock::now() - start > limit) hang(device, stream, what, timeout_s);
    if (i < 64) {
      std::this_thread::yield();
    } else {
      nap = std::min(std::chrono::microseconds(1000), nap + std::chrono::microseconds(20));
      std::this_thread::sleep_for(nap);
    }
  }
}

}  // namespace

void register_stream(cudaStream_t stream, double timeout_s) {
  const int device = current_device();
  std::lock_guard lock(g_mu);
  g_journals[{device, stream}].timeout_s = timeout_s > 0 ? timeout_s : kDefaultDeviceTimeoutSeconds;
}

void close_plan_stream(cudaStream_t stream, int device) noexcept {
  if (stream) {
    if (!device_stuck()) (void)cudaStreamSynchronize(stream);
    forget_stream(stream);
    (void)cudaStreamDestroy(stream);
  }
  release_unused_device_memory(device);
}

void forget_stream(cudaStream_t stream) noexcept {
  const int device = current_device();
  std::lock_guard lock(g_mu);
  const auto it = g_journals.find({device, stream});
  if (it == g_journals.end()) return;
  for (const Entry& e : it->second.entries) (void)cudaEventDestroy(e.event);
  g_journals.erase(it);
}

double stream_timeout(cudaStream_t stream) {
  const int device = current_device();
  std::lock_guard lock(g_mu);
  const auto it = g_journals.find({device, stream});
  return it == g_journals.end() ? kDefaultDeviceTimeoutSeconds : it->second.timeout_s;
}

void journal_launch(const char* name, cudaStream_t stream) noexcept {
  // A failed launch is the caller's to report: its error stays CUDA's last one. Otherwise
  // whatever the calls below leave there (a query's cudaErrorNotReady) is cleared at the end.
  if (cudaPeekAtLastError() != cudaSuccess) return;
  const int device = current_device();
  {
    std::lock_guard lock(g_mu);
    const auto it = g_journals.find({device, stream});
    if (it == g_journals.end()) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    // Under graph capture an event query would invalidate the capture: no journal there.
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
        capture == cudaStreamCaptureStatusNone) {
      Journal& j = it->second;
      prune(device, j);
      if (j.entries.size() >= kMaxEntries) {
        (void)cudaEventDestroy(j.entries.front().event);
        j.entries.pop_front();
      }
      std::vector<cudaEvent_t>& free = g_free_events[device];
      cudaEvent_t e = nullptr;
      if (!free.empty()) {
        e = free.back();
        free.pop_back();
      } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        e = nullptr;
      }
      if (e && cudaEventRecord(e, stream) == cudaSuccess)
        j.entries.push_back({e, name});
      else if (e)
        free.push_back(e);
    }
  }
  (void)cudaGetLastError();
}

void wait_for_stream(cudaStream_t stream, const char* what, double timeout_s) {
  if (timeout_s < 0) timeout_s = stream_timeout(stream);
  poll([&] { return finished(cudaStreamQuery(stream), "cudaStreamQuery"); }, current_device(),
       stream, what, timeout_s);
}

void wait_for_event(cudaEvent_t event, cudaStream_t stream, const char* what, double timeout_s) {
  if (timeout_s < 0) timeout_s = stream_timeout(stream);
  poll([&] { return finished(cudaEventQuery(event), "cudaEventQuery"); }, current_device(), stream,
       what, timeout_s);
}

void plant_hang_if_asked(cudaStream_t stream) {
  static std::once_flag once;
  const char* env = environment_value(Env::test_plant_hang);
  if (!env || std::string(env) != "1") return;
  std::call_once(once, [&] {
    void* never = nullptr;  // a zero the probe waits on; kept for the process's life
    RINGATTN_CUDA_CHECK(cudaMalloc(&never, sizeof(int)));
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(never, 0, sizeof(int), stream));
    launch_watchdog_probe(static_cast<const int*>(never), stream);
  });
}

bool device_stuck() noexcept {
  std::lock_guard lock(g_mu);
  std::erase_if(g_stuck, [](const std::pair<int, cudaEvent_t>& s) {
    const cudaError_t e = cudaEventQuery(s.second);
    if (e == cudaErrorNotReady) return false;
    (void)cudaEventDestroy(s.second);
    return true;  // finished (or faulted: then nothing runs there any more)
  });
  return !g_stuck.empty();
}

}  // namespace ringattn::kernels::cuda
