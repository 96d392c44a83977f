// The NCCL communicator (labels `gpu`, `mpi`; run under mpiexec -n 1, or -n G on a machine
// with G GPUs): nonblocking init bootstrapped over MPI, the version and device report, one
// ring step of grouped send/receive between device buffers, and the watchdog: a receive
// that no rank sends to is cancelled (ncclCommAbort) after the timeout with NCCL's reason.
// Without a usable CUDA device every test is skipped with the reason printed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/inproc_communicator.hpp"
#include "ring/nccl_communicator.hpp"
#include "ring/progress_thread.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

Communicator* g_control = nullptr;
std::string g_skip;  // why there is nothing to test on (empty: a GPU is there)

#define SKIP_WITHOUT_GPU() \
  if (!g_skip.empty()) GTEST_SKIP() << g_skip

TEST(Nccl, InitialisesNonblockingAndReportsVersionAndDevice) {
  SKIP_WITHOUT_GPU();
  auto comm = make_nccl_communicator(*g_control, {60});
  EXPECT_EQ(comm->size(), g_control->size());
  EXPECT_EQ(comm->memory_space(), MemorySpace::device);
  const std::string v = comm->library_version();
  std::printf("  rank %d: %s\n", comm->rank(), v.c_str());
  EXPECT_NE(v.find("NCCL 2."), std::string::npos) << v;
  EXPECT_NE(v.find("PCI "), std::string::npos) << v;
}

TEST(Nccl, OneRingStepMovesDeviceBuffersToTheNextRank) {
  SKIP_WITHOUT_GPU();
  auto comm = make_nccl_communicator(*g_control, {60});
  const int r = comm->rank(), p = comm->size();
  constexpr std::size_t n = 1 << 20;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(r * 1000003 + i % 9973);
  float *send = nullptr, *recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  const Transfer s{(r + 1) % p, send, n * sizeof(float)};
  const Transfer v{(r + p - 1) % p, recv, n * sizeof(float)};
  auto ex = comm->start(std::span(&s, 1), std::span(&v, 1), 0);
  const auto t0 = std::chrono::steady_clock::now();
  while (!ex->test()) ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_NE(ex->device_event(), nullptr);
  std::vector<float> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  const int from = (r + p - 1) % p;
  for (std::size_t i = 0; i < n; i += 4099)
    ASSERT_EQ(got[i], static_cast<float>(from * 1000003 + i % 9973)) << i;
  cudaFree(send);
  cudaFree(recv);
}

TEST(Nccl, WatchdogAbortsAnExchangeThatCannotCompleteNamingNcclsReason) {
  SKIP_WITHOUT_GPU();
  auto comm = make_nccl_communicator(*g_control, {60});
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1024), cudaSuccess);
  // Every rank waits to receive from its predecessor, which sends nothing: a stall.
  const int from = (comm->rank() + comm->size() - 1) % comm->size();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ProgressThread progress(*comm, 1.0);
    progress.wait(progress.post({}, {{from, buf, 1024}}, 0, 1, "forward K/V"));
    ADD_FAILURE() << "an exchange with no sender completed";
  } catch (const RuntimeFailure& e) {
    const std::string msg = e.what();
    std::printf("  watchdog: %s\n", msg.c_str());
    // Either the watchdog fired, or NCCL refused the unmatched receive itself: both must
    // end promptly with NCCL's account.
    EXPECT_TRUE(msg.find("did not complete within 1 s") != std::string::npos ||
                msg.find("NCCL") != std::string::npos)
        << msg;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  cudaFree(buf);  // the communicator was aborted; it only has to be destroyed now
}

// Review item 1: ranks whose GPU is not device 0, driven from the ring's progress thread
// (a thread whose current device is 0). Every entry point of the communicator makes its
// device current, so its events and streams belong together and the step completes;
// before, the progress thread created and recorded events on device 0 for a stream of
// device r (cudaErrorInvalidResourceHandle). Virtual ranks, one device each (NCCL refuses
// two ranks of one communicator on one device).
TEST(Nccl, VirtualRanksOnTheirOwnDevicesRunARingStepFromTheProgressThread) {
  SKIP_WITHOUT_GPU();
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "SKIPPED: needs two GPUs (this machine has " << devices << ")";
  const int p = std::min(devices, 4);
  constexpr std::size_t n = 1 << 16;
  const int rc = run_virtual_ranks(p, [&](Communicator& control) {
    const int r = control.rank();
    auto comm = make_nccl_communicator(control, {30});
    if (cudaSetDevice(r) != cudaSuccess) return 1;
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(r * 7919 + i % 613);
    float *send = nullptr, *recv = nullptr;
    if (cudaMalloc(&send, n * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&recv, n * sizeof(float)) != cudaSuccess ||
        cudaMemcpy(send, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
      return 1;
    if (cudaSetDevice(0) != cudaSuccess) return 1;  // another rank's device is current now
    {
      ProgressThread progress(*comm, 20.0);
      progress.wait(progress.post({{(r + 1) % p, send, n * sizeof(float)}},
                                  {{(r + p - 1) % p, recv, n * sizeof(float)}}, 0, 0, "ring step"));
    }
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != 0) return 1;
    if (cudaSetDevice(r) != cudaSuccess) return 1;
    std::vector<float> got(n);
    if (cudaMemcpy(got.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
      return 1;
    const int from = (r + p - 1) % p;
    for (std::size_t i = 0; i < n; i += 101)
      if (got[i] != static_cast<float>(from * 7919 + i % 613)) return 2;
    cudaFree(send);
    cudaFree(recv);
    return 0;
  });
  EXPECT_EQ(rc, 0) << "a rank failed (1: a CUDA call, 2: wrong data received)";
}

}  // namespace
}  // namespace ringattn::ring

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace ringattn::ring;
  std::unique_ptr<Communicator> control =
      launched_by_mpi() ? make_mpi_communicator(&argc, &argv) : make_local_communicator();
  g_control = control.get();
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess)
    g_skip = std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(rc);
  else if (devices == 0)
    g_skip = "no CUDA device visible";
  if (!g_skip.empty() && control->rank() == 0) std::printf("SKIPPED: %s\n", g_skip.c_str());
  if (control->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  const int64_t worst = control->max(static_cast<int64_t>(result));
  control.reset();
  return static_cast<int>(worst);
}
