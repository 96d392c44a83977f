// mbarriers and bulk copies: a warp-specialised pipeline (a producer
// warp copying stages into a double buffer, a consumer warp waiting on "full" and releasing
// on "empty") gives the same bytes in every execution mode, with either warp running first;
// waits make progress as scheduling points (try_wait and a test_wait spin loop); a missing
// wait shows as landing dependence; what would hang or be undefined on the device is a fault
// naming kernel, block and thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/mbarrier.hpp"
#include "emu/mode_sweep.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::bytes_of;
using testing::faults;

const ExecutionMode kAtCopy{RunOrder::forward, 0, CpAsyncLanding::at_copy};
const ExecutionMode kAtWait{RunOrder::forward, 0, CpAsyncLanding::at_wait};
const ExecutionMode kAtCopyYield{RunOrder::forward, 0, CpAsyncLanding::at_copy, true};

constexpr unsigned kStages = 6, kChunk = 32;  // floats per stage (128 bytes)

struct alignas(16) Source {
  float values[kStages * kChunk];
};

Source counting() {
  Source s;
  for (unsigned i = 0; i < kStages * kChunk; ++i) s.values[i] = static_cast<float>(i + 1);
  return s;
}

enum class Consumer { waits, skips_the_wait, test_wait_spin, wrong_parity, frees_before_reading };

// Shared layout: full[2], empty[2] barriers (8 bytes each) at 0..31, buffers at 32.
// Warp `producer_warp`'s lane 0 produces; the other warp's 32 lanes consume, each summing
// its element of every stage.
std::vector<float> pipeline(Consumer how, unsigned producer_warp = 0) {
  const Source src = counting();
  std::vector<float> out(kChunk);
  launch(LaunchConfig{"pipeline", Dim3{1}, Dim3{64}, 32 + 2 * kChunk * 4}, [&] {
    const SharedAddress full[2] = {SharedAddress{0}, SharedAddress{8}};
    const SharedAddress empty[2] = {SharedAddress{16}, SharedAddress{24}};
    const SharedPtr<float> buf = SharedPtr<float>(SharedAddress{32});
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
      for (unsigned b = 0; b < 2; ++b) {
        mbarrier_init(full[b], 1);
        mbarrier_init(empty[b], 32);
      }
    }
    __syncthreads();
    if (warp == producer_warp) {
      if (lane != 0) return;
      for (unsigned s = 0; s < kStages; ++s) {
        const unsigned b = s % 2, use = s / 2;
        // The buffer is free once its previous use was consumed (parity 1 passes at once).
        mbarrier_try_wait_parity(empty[b], (use + 1) % 2);
        mbarrier_arrive_expect_tx(full[b], kChunk * 4);
        cp_async_bulk_global_to_shared((buf + b * kChunk).address(), src.values + s * kChunk,
                                       kChunk * 4, full[b]);
      }
      return;
    }
    float sum = 0;
    for (unsigned s = 0; s < kStages; ++s) {
      const unsigned b = s % 2, use = s / 2;
      switch (how) {
        case Consumer::waits:
          mbarrier_try_wait_parity(full[b], use % 2);
          break;
        case Consumer::test_wait_spin:
          while (!mbarrier_test_wait_parity(full[b], use % 2)) {
          }
          break;
        case Consumer::wrong_parity:
          mbarrier_try_wait_parity(full[b], (use + 1) % 2);
          break;
        case Consumer::skips_the_wait:
          break;
        case Consumer::frees_before_reading:
          mbarrier_try_wait_parity(full[b], use % 2);
          mbarrier_arrive(empty[b]);  // the stage is the producer's again: the read races
          break;
      }
      sum += buf[b * kChunk + lane];
      if (how == Consumer::frees_before_reading) continue;
      if (how == Consumer::skips_the_wait) mbarrier_try_wait_parity(full[b], use % 2);
      mbarrier_arrive(empty[b]);
    }
    out[lane] = sum;
  });
  return out;
}

std::vector<float> expected() {
  std::vector<float> want(kChunk, 0.0f);
  for (unsigned s = 0; s < kStages; ++s)
    for (unsigned l = 0; l < kChunk; ++l) want[l] += static_cast<float>(s * kChunk + l + 1);
  return want;
}

TEST(Mbarrier, WarpSpecialisedPipelineIsExactInEveryMode) {
  for (const unsigned producer : {0u, 1u})
    for (const Consumer how : {Consumer::waits, Consumer::test_wait_spin}) {
      const ScopedExecutionMode at_wait(kAtWait);
      EXPECT_EQ(pipeline(how, producer), expected()) << "producer warp " << producer;
      const std::vector<ExecutionMode> modes = standard_modes();
      EXPECT_EQ(find_mode_dependence([&] { return bytes_of(pipeline(how, producer)); }, modes),
                std::nullopt)
          << "producer warp " << producer;
    }
}

// Reading a stage before waiting on its barrier reads what has not landed: the arena's
// poison when copies land at the wait, so the result depends on the mode.
TEST(Mbarrier, AMissingWaitShowsAsLandingDependence) {
  const std::vector<ExecutionMode> modes = {kAtCopy, kAtWait};
  const auto difference =
      find_mode_dependence([&] { return bytes_of(pipeline(Consumer::skips_the_wait)); }, modes);
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("cp.async=at-wait"), std::string::npos) << *difference;
  const ScopedExecutionMode at_wait(kAtWait);
  EXPECT_TRUE(std::isnan(pipeline(Consumer::skips_the_wait)[0])) << "the poison, not the copy";
}

// Freeing a stage (arriving on "empty") before the last read of it lets the producer's next
// copy land there first: on a GPU a race, here a mode dependence, since under arrive=yield
// the arrive that completes the phase lets the waiting producer run (and its copy land)
// before the consumer reads.
TEST(Mbarrier, AStageFreedBeforeItsLastReadShowsAsModeDependence) {
  const std::vector<ExecutionMode> modes = {kAtCopy, kAtCopyYield};
  const auto difference = find_mode_dependence(
      [&] { return bytes_of(pipeline(Consumer::frees_before_reading)); }, modes);
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("arrive=yield"), std::string::npos) << *difference;
  const ScopedExecutionMode plain(kAtCopy);
  EXPECT_EQ(pipeline(Consumer::frees_before_reading), expected()) << "no yield: no race seen";
}

// Waiting on the other phase's parity passes where it should wait and waits where it should
// pass: the consumers run ahead, and the producer ends up waiting on a release that never
// comes. On a GPU that hangs; here it is a fault naming the barrier and its counts.
TEST(Mbarrier, AWaitOnTheWrongPhaseIsAFault) {
  for (const ExecutionMode& mode : {kAtCopy, kAtWait}) {
    const ScopedExecutionMode scoped(mode);
    EXPECT_TRUE(faults([] { pipeline(Consumer::wrong_parity); }, "pipeline", Dim3{0, 0, 0},
                       Dim3{0, 0, 0}, "which can never complete"))
        << describe(mode);
  }
}

TEST(Mbarrier, AWaitThatCanNeverCompleteIsAFault) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"never_arrives", Dim3{1}, Dim3{64}, 16}, [] {
          if (threadIdx.x == 0) mbarrier_init(SharedAddress{0}, 2);
          __syncthreads();
          if (threadIdx.x == 33) mbarrier_try_wait_parity(SharedAddress{0}, 0);
          if (threadIdx.x == 5) mbarrier_arrive(SharedAddress{0});  // one of the two
        });
      },
      "never_arrives", Dim3{0, 0, 0}, Dim3{33, 0, 0},
      "still waits for 1 of 2 arrivals and 0 transaction bytes"));
}

TEST(Mbarrier, MisuseIsAFaultNamingTheThread) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"uninitialised", Dim3{1}, Dim3{32}, 16}, [] {
          if (threadIdx.x == 7) mbarrier_arrive(SharedAddress{8});
        });
      },
      "uninitialised", Dim3{0, 0, 0}, Dim3{7, 0, 0}, "no mbarrier was initialised"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"too_many_arrivals", Dim3{1}, Dim3{32}, 16}, [] {
          if (threadIdx.x == 0) {
            mbarrier_init(SharedAddress{0}, 1);
            mbarrier_expect_tx(SharedAddress{0}, 16);  // the phase stays open for 16 bytes
          }
          __syncthreads();
          if (threadIdx.x < 2) mbarrier_arrive(SharedAddress{0});
        });
      },
      "too_many_arrivals", Dim3{0, 0, 0}, Dim3{1, 0, 0}, "more arrivals than the mbarrier's count"));
  const Source src = counting();
  for (const ExecutionMode& mode : {kAtCopy, kAtWait}) {
    const ScopedExecutionMode scoped(mode);
    EXPECT_TRUE(faults(
        [&] {
          launch(LaunchConfig{"too_many_bytes", Dim3{1}, Dim3{1}, 16 + 64}, [&] {
            mbarrier_init(SharedAddress{0}, 1);
            mbarrier_arrive_expect_tx(SharedAddress{0}, 32);
            cp_async_bulk_global_to_shared(SharedAddress{16}, src.values, 64, SharedAddress{0});
            mbarrier_try_wait_parity(SharedAddress{0}, 0);
          });
        },
        "too_many_bytes", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "32 transaction bytes more than expect-tx"))
        << describe(mode);
  }
  const ScopedExecutionMode at_wait(kAtWait);
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"exits_in_flight", Dim3{1}, Dim3{32}, 16 + 64}, [&] {
          if (threadIdx.x != 3) return;
          mbarrier_init(SharedAddress{0}, 1);
          mbarrier_arrive_expect_tx(SharedAddress{0}, 64);
          cp_async_bulk_global_to_shared(SharedAddress{16}, src.values, 64, SharedAddress{0});
        });
      },
      "exits_in_flight", Dim3{0, 0, 0}, Dim3{3, 0, 0}, "exited with a bulk copy"));
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"bulk_misaligned", Dim3{1}, Dim3{1}, 16 + 64}, [&] {
          mbarrier_init(SharedAddress{0}, 1);
          cp_async_bulk_global_to_shared(SharedAddress{24}, src.values, 32, SharedAddress{0});
        });
      },
      "bulk_misaligned", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "not 16-byte aligned"));
}

}  // namespace
}  // namespace ringattn::emu
