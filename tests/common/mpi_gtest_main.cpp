#include "mpi_gtest_main.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

namespace ringattn::testing {

int run_gtests_on_ranks(int argc, char** argv, ring::Communicator*& comm) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<ring::Communicator> owned = ring::launched_by_mpi()
                                                  ? ring::make_mpi_communicator(&argc, &argv)
                                                  : ring::make_local_communicator();
  comm = owned.get();
  // Only rank 0 prints gtest's report; every rank's result decides the exit code.
  if (owned->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  const int64_t worst = owned->max(static_cast<int64_t>(rc));
  if (owned->rank() == 0 && worst != rc)
    std::printf("another rank reported failures (its assertions are printed above)\n");
  comm = nullptr;
  owned.reset();
  return static_cast<int>(worst);
}

}  // namespace ringattn::testing
