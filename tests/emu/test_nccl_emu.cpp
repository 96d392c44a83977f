// The emulated NCCL (label gpu-emu): ranks are host threads, each on its own emulated device.
// Nonblocking initialisation, ring exchanges of device buffers checked bitwise (one transfer
// at a time, and grouped in the order that deadlocks without groups), the mistakes NCCL
// refuses (sizes that differ, two ranks on one device, a stream or buffer of another
// device), abort of a rank waiting for a send that never comes, and finalize/destroy.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Runs fn(rank) on one host thread per rank, with device first_device + rank current.
void on_ranks(int ranks, const std::function<void(int)>& fn, int first_device = 0) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&fn, r, first_device] {
      ASSERT_EQ(cudaSetDevice(first_device + r), cudaSuccess);
      fn(r);
    });
  for (std::thread& t : threads) t.join();
}

// Polls a nonblocking communicator until its pending call has finished; its final state.
ncclResult_t settle(ncclComm_t comm) {
  const auto deadline = Clock::now() + 5s;
  ncclResult_t state = ncclInProgress;
  while (Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress) return state;
    std::this_thread::sleep_for(1ms);
  }
  return state;
}

ncclComm_t join_nonblocking(const ncclUniqueId& id, int ranks, int rank) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, ranks, id, rank, &config), ncclInProgress);
  return comm;
}

// What a clean shutdown of a nonblocking communicator looks like.
void finalize_and_destroy(ncclComm_t comm) {
  const ncclResult_t rc = ncclCommFinalize(comm);
  EXPECT_TRUE(rc == ncclSuccess || rc == ncclInProgress) << ncclGetErrorString(rc);
  EXPECT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

ncclUniqueId new_id() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return id;
}

// Words whose bits depend on the rank and the index, NaN and denormal patterns included, so
// a copy that converts or reorders anything is caught.
std::vector<std::uint32_t> pattern(int rank, std::size_t words) {
  std::vector<std::uint32_t> v(words);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
  for (std::uint32_t& w : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w = static_cast<std::uint32_t>(x >> 16);
  }
  return v;
}

std::uint32_t* device_copy_of(const std::vector<std::uint32_t>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<std::uint32_t*>(p);
}

bool holds(const std::uint32_t* device, const std::vector<std::uint32_t>& expected) {
  std::vector<std::uint32_t> got(expected.size());
  EXPECT_EQ(cudaMemcpy(got.data(), device, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return std::memcmp(got.data(), expected.data(), got.size() * 4) == 0;
}

bool contains(const char* text, const std::string& needle) {
  return std::string(text).find(needle) != std::string::npos;
}

TEST(NcclEmu, ReportsVersion2_28_9) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, 22809);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_STREQ(ncclGetErrorString(ncclInProgress), "NCCL operation in progress");
}

TEST(NcclEmu, NonblockingInitCompletesOnceEveryRankHasJoined) {
  const ncclUniqueId id = new_id();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t first = join_nonblocking(id, 2, 0);
  std::this_thread::sleep_for(20ms);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(first, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress) << "complete before rank 1 joined";
  ncclComm_t second = nullptr;
  std::thread rank1([&] {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    second = join_nonblocking(id, 2, 1);
    EXPECT_EQ(settle(second), ncclSuccess);
  });
  EXPECT_EQ(settle(first), ncclSuccess) << ncclGetLastError(first);
  rank1.join();
  // Ids are single-use, as NCCL's.
  ncclComm_t again = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&again, 2, id, 0, nullptr), ncclInvalidUsage);
  finalize_and_destroy(first);
  finalize_and_destroy(second);
}

TEST(NcclEmu, BlockingInitReturnsOnceEveryRankHasJoined) {
  const ncclUniqueId id = new_id();
  on_ranks(3, [&](int r) {
    if (r == 2) std::this_thread::sleep_for(20ms);  // the others wait for the last one
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&comm, 3, id, r, nullptr), ncclSuccess)
        << ncclGetLastError(nullptr);
    ncclResult_t state = ncclInProgress;
    ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
    EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);  // blocking: returns when flushed
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  });
}

class NcclEmuRing : public ::testing::TestWithParam<int> {};

// Without groups, each transfer is its own stream task that ends once the peer took it, so
// even ranks send first and odd ranks receive first (with all sending first, a ring stalls).
TEST_P(NcclEmuRing, ExchangesDeviceBuffersOneTransferAtATimeBitwise) {
  const int p = GetParam();
  const ncclUniqueId id = new_id();
  constexpr std::size_t words = 1 << 16;
  on_ranks(p, [&](int r) {
    ncclComm_t comm = join_nonblocking(id, p, r);
    ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    std::uint32_t* send = device_copy_of(pattern(r, words));
    std::uint32_t* recv = device_copy_of(std::vector<std::uint32_t>(words));
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    auto send_next = [&] { return ncclSend(send, words, ncclFloat32, next, comm, stream); };
    auto recv_prev = [&] { return ncclRecv(recv, words, ncclFloat32, prev, comm, stream); };
    if (r % 2 == 0) {
      EXPECT_EQ(send_next(), ncclSuccess) << ncclGetLastError(comm);
      EXPECT_EQ(recv_prev(), ncclSuccess) << ncclGetLastError(comm);
    } else {
      EXPECT_EQ(recv_prev(), ncclSuccess) << ncclGetLastError(comm);
      EXPECT_EQ(send_next(), ncclSuccess) << ncclGetLastError(comm);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(holds(recv, pattern(prev, words))) << "rank " << r;
    finalize_and_destroy(comm);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    EXPECT_EQ(cudaFree(send), cudaSuccess);
    EXPECT_EQ(cudaFree(recv), cudaSuccess);
  });
}

// P - 1 ring steps, each one group that sends before it receives, issued without any host
// synchronisation: after step s, buffer s + 1 holds rank r - s - 1's block.
TEST_P(NcclEmuRing, GroupedSendToNextReceiveFromPreviousPassesEveryBlockAround) {
  const int p = GetParam();
  const ncclUniqueId id = new_id();
  constexpr std::size_t words = 1 << 14;
  on_ranks(p, [&](int r) {
    ncclComm_t comm = join_nonblocking(id, p, r);
    ASSERT_EQ(settle(comm), ncclSuccess) << ncclGetLastError(comm);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::vector<std::uint32_t*> blocks{device_copy_of(pattern(r, words))};
    for (int s = 1; s < p; ++s) blocks.push_back(device_copy_of(std::vector<std::uint32_t>(words)));
    for (int s = 0; s + 1 < p; ++s) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(blocks[s], words, ncclUint32, (r + 1) % p, comm, stream), ncclSuccess);
      ASSERT_EQ(ncclRecv(blocks[s + 1], words, ncclUint32, (r + p - 1) % p, comm, stream),
                ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int s = 0; s < p; ++s)
      EXPECT_TRUE(holds(blocks[s], pattern((r - s + p) % p, words)))
          << "rank " << r << " block " << s;
    finalize_and_destroy(comm);
    for (std::uint32_t* b : blocks) EXPECT_EQ(cudaFree(b), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclEmuRing, ::testing::Values(2, 4),
                         [](const auto& p) { return std::to_string(p.param) + "Ranks"; });

TEST(NcclEmu, MismatchedSizesFailBothRanksNamingTheSizes) {
  const ncclUniqueId id = new_id();
  on_ranks(2, [&](int r) {
    ncclComm_t comm = join_nonblocking(id, 2, r);
    ASSERT_EQ(settle(comm), ncclSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    std::uint32_t* buf = device_copy_of(std::vector<std::uint32_t>(512));
    if (r == 0)
      ASSERT_EQ(ncclSend(buf, 256, ncclUint32, 1, comm, stream), ncclSuccess);
    else
      ASSERT_EQ(ncclRecv(buf, 512, ncclUint32, 0, comm, stream), ncclSuccess);
    // A failed transfer is a failed stream task: the device's error is sticky, as a fault's.
    EXPECT_NE(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(settle(comm), ncclInvalidUsage);
    const char* why = ncclGetLastError(comm);
    std::printf("  %s\n", why);
    EXPECT_TRUE(contains(why, "2048 bytes") && contains(why, "send of 1024 bytes")) << why;
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    cudaStreamDestroy(stream);
    EXPECT_EQ(cudaDeviceReset(), cudaSuccess);  // a clean device (and buf freed) for later tests
  });
}

TEST(NcclEmu, TwoRanksOnOneDeviceAreRefused) {
  const ncclUniqueId blocking_id = new_id();
  on_ranks(2, [&](int r) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRankConfig(&comm, 2, blocking_id, r, nullptr), ncclInvalidUsage);
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(contains(ncclGetLastError(nullptr), "ranks 0 and 1 both on device 0"))
        << ncclGetLastError(nullptr);
  });
  // Nonblocking, the refusal is the communicators' asynchronous error.
  const ncclUniqueId id = new_id();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ncclComm_t a = join_nonblocking(id, 2, 0), b = join_nonblocking(id, 2, 1);
  for (ncclComm_t comm : {a, b}) {
    EXPECT_EQ(settle(comm), ncclInvalidUsage);
    EXPECT_TRUE(contains(ncclGetLastError(comm), "ranks 0 and 1 both on device 1"))
        << ncclGetLastError(comm);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
}

TEST(NcclEmu, SendAndReceiveRefuseAStreamOrBufferOfAnotherDevice) {
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(2);
  std::vector<cudaStream_t> streams(2);
  std::vector<std::uint32_t*> bufs(2);
  for (int r = 0; r < 2; ++r) {  // nonblocking: one thread can start both ranks
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    comms[r] = join_nonblocking(id, 2, r);
    ASSERT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
    bufs[r] = device_copy_of(std::vector<std::uint32_t>(64));
  }
  for (ncclComm_t comm : comms) ASSERT_EQ(settle(comm), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<std::uint32_t> host(64);
  struct Case {
    const void* buffer;
    cudaStream_t stream;
    int peer;
    const char* says;
  };
  for (const Case& c : {Case{bufs[0], streams[1], 1, "stream belongs to device 1"},
                        Case{bufs[1], streams[0], 1, "memory of another device"},
                        Case{host.data(), streams[0], 1, "not device memory"},
                        Case{bufs[0], streams[0], 2, "peer 2 is not a rank"}}) {
    EXPECT_EQ(ncclSend(c.buffer, 64, ncclUint32, c.peer, comms[0], c.stream), ncclInvalidArgument);
    EXPECT_TRUE(contains(ncclGetLastError(comms[0]), c.says)) << ncclGetLastError(comms[0]);
    // In a group, the refused call fails the whole group: nothing of it is issued.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclRecv(bufs[0], 64, ncclUint32, 1, comms[0], streams[0]), ncclSuccess);
    EXPECT_EQ(ncclRecv(const_cast<void*>(c.buffer), 64, ncclUint32, c.peer, comms[0], c.stream),
              ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  }
  EXPECT_EQ(cudaStreamSynchronize(streams[0]), cudaSuccess);  // nothing waits for rank 1
  for (int r = 0; r < 2; ++r) {
    finalize_and_destroy(comms[r]);
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(streams[r]), cudaSuccess);
    EXPECT_EQ(cudaFree(bufs[r]), cudaSuccess);
  }
}

TEST(NcclEmu, AbortUnblocksARankWaitingForASendThatNeverComes) {
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    comms[r] = join_nonblocking(id, 2, r);
  }
  for (ncclComm_t comm : comms) ASSERT_EQ(settle(comm), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::uint32_t* buf = device_copy_of(std::vector<std::uint32_t>(256));
  ASSERT_EQ(ncclRecv(buf, 256, ncclUint32, 1, comms[0], stream), ncclSuccess);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "a receive with no sender completed";

  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  // An aborted NCCL kernel exits; the device stays usable.
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LT(Clock::now() - t0, 1s);
  const char* why = ncclGetLastError(comms[0]);
  std::printf("  %s\n", why);
  EXPECT_TRUE(contains(why, "peer 1 never posted the matching send") &&
              contains(why, "(communicator aborted)"))
      << why;
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comms[0], &state), ncclSuccess);
  EXPECT_NE(state, ncclSuccess);
  EXPECT_NE(state, ncclInProgress);
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);  // idempotent
  EXPECT_EQ(ncclRecv(buf, 256, ncclUint32, 1, comms[0], stream), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
  finalize_and_destroy(comms[1]);  // rank 1 had nothing in flight
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
}

TEST(NcclEmu, AbortOfAPeerFailsTheTransferWaitingOnIt) {
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    comms[r] = join_nonblocking(id, 2, r);
  }
  for (ncclComm_t comm : comms) ASSERT_EQ(settle(comm), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::uint32_t* buf = device_copy_of(std::vector<std::uint32_t>(256));
  ASSERT_EQ(ncclRecv(buf, 256, ncclUint32, 0, comms[1], stream), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  EXPECT_NE(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(settle(comms[1]), ncclRemoteError);
  EXPECT_TRUE(contains(ncclGetLastError(comms[1]), "peer 0 aborted its communicator"))
      << ncclGetLastError(comms[1]);
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaStreamDestroy(stream);
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);  // a clean device (and buf freed) for later tests
}

TEST(NcclEmu, FinalizeWaitsForQueuedWorkThenDestroyIsClean) {
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(2);
  std::vector<cudaStream_t> streams(2);
  std::vector<std::uint32_t*> bufs(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    comms[r] = join_nonblocking(id, 2, r);
    ASSERT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
    bufs[r] = device_copy_of(pattern(r, 1024));
  }
  for (ncclComm_t comm : comms) ASSERT_EQ(settle(comm), ncclSuccess);
  ASSERT_EQ(ncclSend(bufs[0], 1024, ncclUint32, 1, comms[0], streams[0]), ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(comms[0]), ncclInProgress);
  std::this_thread::sleep_for(20ms);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comms[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress) << "finalized while its send waits for rank 1";
  EXPECT_EQ(ncclSend(bufs[0], 1024, ncclUint32, 1, comms[0], streams[0]), ncclInvalidUsage);
  ASSERT_EQ(ncclRecv(bufs[1], 1024, ncclUint32, 0, comms[1], streams[1]), ncclSuccess);
  EXPECT_EQ(settle(comms[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
  finalize_and_destroy(comms[1]);
  EXPECT_EQ(ncclCommGetAsyncError(comms[0], &state), ncclInvalidArgument);  // destroyed
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_TRUE(holds(bufs[1], pattern(0, 1024)));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(streams[r]), cudaSuccess);
    EXPECT_EQ(cudaFree(bufs[r]), cudaSuccess);
  }
}

}  // namespace
