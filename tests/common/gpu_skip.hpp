// The GPU tests' skip: without a usable device (no GPU, no driver, a CPU-only build) a test
// is skipped with the reason printed, never silently.
#pragma once

#include <gtest/gtest.h>

#include "ringattn/cuda_plan.hpp"

#define REQUIRE_GPU()                                                          \
  do {                                                                         \
    const ::ringattn::CudaDeviceStatus gpu_ = ::ringattn::probe_cuda_device(); \
    if (!gpu_.usable) GTEST_SKIP() << "SKIPPED: " << gpu_.reason;              \
  } while (0)
