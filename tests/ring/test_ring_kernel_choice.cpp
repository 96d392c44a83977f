// `--kernel auto`'s rule for the GPU ring (ring_kernel_choice.hpp), on the host: cuDNN's steps
// only where they timed faster, never under --deterministic, and the test hook's timings
// parsed as documented (malformed ones refused naming the variable).
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "ring/ring_kernel_choice.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

TEST(RingKernelChoice, AutoTakesCudnnOnlyWhereFasterAndNeverWhenDeterministic) {
  EXPECT_TRUE(ring_auto_takes_cudnn({2.0, 1.0}, false));
  EXPECT_FALSE(ring_auto_takes_cudnn({1.0, 2.0}, false));
  EXPECT_FALSE(ring_auto_takes_cudnn({1.0, 1.0}, false));  // a tie keeps ours
  EXPECT_FALSE(ring_auto_takes_cudnn({2.0, 1.0}, true));
  EXPECT_FALSE(ring_auto_takes_cudnn({1.0, std::numeric_limits<double>::infinity()}, false));
  EXPECT_EQ(ring_auto_note("forward", "hopper", {2.0, 1.0}, true, false),
            "kernel=auto: ring forward hopper 2.000 ms, cudnn 1.000 ms (median of 5, slowest "
            "rank); using cudnn");
}

TEST(RingKernelChoice, StubbedTimingsAreParsedOrRefusedNamingTheVariable) {
  unsetenv("RINGATTN_TEST_RING_AUTO_MS");
  EXPECT_FALSE(ring_auto_stubbed_timing(false).has_value());
  setenv("RINGATTN_TEST_RING_AUTO_MS", "3,1.5", 1);
  for (const bool backward : {false, true}) {  // two numbers serve both passes
    const auto t = ring_auto_stubbed_timing(backward);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->ours_ms, 3.0);
    EXPECT_EQ(t->cudnn_ms, 1.5);
  }
  setenv("RINGATTN_TEST_RING_AUTO_MS", "3,1.5,1,4", 1);
  EXPECT_EQ(ring_auto_stubbed_timing(true)->ours_ms, 1.0);
  EXPECT_EQ(ring_auto_stubbed_timing(true)->cudnn_ms, 4.0);
  for (const char* bad : {"3", "3,x", "3,1,2", "-1,2", "3,,1,2"}) {
    setenv("RINGATTN_TEST_RING_AUTO_MS", bad, 1);
    try {
      (void)ring_auto_stubbed_timing(false);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "RINGATTN_TEST_RING_AUTO_MS") << bad;
    }
  }
  unsetenv("RINGATTN_TEST_RING_AUTO_MS");
}

}  // namespace
}  // namespace ringattn::ring
