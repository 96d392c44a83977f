// --comm selection (label `cli`): every combination of request, device, build and launch,
// including NCCL builds and MPI launches this machine cannot produce, through the pure
// choose_comm(); the CLI-reachable refusals are also run end to end (exit 2, naming the option).
#include <gtest/gtest.h>

#include "cli/comm_choice.hpp"
#include "cli/option_names.hpp"
#include "cli_runner.hpp"
#include "ring/device_transport.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::cli {
namespace {

using namespace ringattn::ring;

CommContext ctx(const std::string& requested, const std::string& device, bool nccl, bool mpi,
                bool launched, int world, int ring_size) {
  CommContext c;
  c.requested = requested;
  c.device = device;
  c.have_cuda_kernels = true;
  c.have_nccl = nccl;
  c.have_mpi = mpi;
  c.launched_by_mpi = launched;
  c.world_size = world;
  c.ring_size = ring_size;
  return c;
}

// The option named and a phrase of the message, or "" when the choice must succeed.
void expect_refused(const CommContext& c, const std::string& subject, const std::string& phrase) {
  try {
    const CommKind k = choose_comm(c);
    ADD_FAILURE() << "chose " << to_string(k) << " for --comm " << c.requested;
  } catch (const InputError& e) {
    EXPECT_EQ(e.subject(), subject) << e.what();
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

TEST(CommChoice, AutoPrefersNcclOnCudaThenMpiUnderALauncherThenLocal) {
  EXPECT_EQ(choose_comm(ctx("auto", "cuda", true, true, true, 8, 0)), CommKind::nccl);
  EXPECT_EQ(choose_comm(ctx("auto", "cuda", true, false, false, 1, 0)), CommKind::nccl);
  EXPECT_EQ(choose_comm(ctx("auto", "cuda", false, true, true, 8, 0)), CommKind::mpi);
  EXPECT_EQ(choose_comm(ctx("auto", "cpu", true, true, true, 8, 0)), CommKind::mpi);
  EXPECT_EQ(choose_comm(ctx("auto", "cpu", true, true, false, 1, 0)), CommKind::local);
  EXPECT_EQ(choose_comm(ctx("auto", "cpu", true, true, false, 1, 4)), CommKind::local);
  // Virtual ranks on one GPU: NCCL would refuse two ranks per device.
  EXPECT_EQ(choose_comm(ctx("auto", "cuda", true, true, false, 1, 4)), CommKind::local);
}

TEST(CommChoice, ExplicitChoicesThatCanRun) {
  EXPECT_EQ(choose_comm(ctx("nccl", "cuda", true, true, true, 4, 4)), CommKind::nccl);
  EXPECT_EQ(choose_comm(ctx("nccl", "cuda", true, false, false, 1, 1)), CommKind::nccl);
  EXPECT_EQ(choose_comm(ctx("mpi", "cuda", true, true, true, 4, 0)), CommKind::mpi);
  EXPECT_EQ(choose_comm(ctx("mpi", "cpu", false, true, true, 1, 0)), CommKind::mpi);
  EXPECT_EQ(choose_comm(ctx("local", "cpu", false, false, false, 1, 3)), CommKind::local);
  EXPECT_EQ(choose_comm(ctx("local", "cpu", false, true, true, 1, 0)), CommKind::local);
}

TEST(CommChoice, RefusalsNameTheOptionAndSayWhy) {
  expect_refused(ctx("nccl", "cuda", false, true, true, 2, 0), "--comm", "has no NCCL");
  expect_refused(ctx("nccl", "cpu", true, true, true, 2, 0), "--comm", "needs --device cuda");
  expect_refused(ctx("nccl", "cuda", true, true, false, 1, 4), "--comm",
                 "NCCL refuses two ranks on one GPU");
  expect_refused(ctx("mpi", "cpu", true, false, false, 1, 0), "--comm", "has no MPI");
  expect_refused(ctx("mpi", "cpu", true, true, false, 1, 2), "--comm", "needs an MPI launcher");
  expect_refused(ctx("local", "cpu", true, true, true, 2, 0), "--comm", "this job has 2 MPI ranks");
  expect_refused(ctx("sharedmem", "cpu", true, true, false, 1, 0), "--comm", "unknown value");
  CommContext no_kernels = ctx("auto", "cuda", true, true, false, 1, 0);
  no_kernels.have_cuda_kernels = false;
  expect_refused(no_kernels, "--device", "CPU kernels only");
}

// End to end, the cases this machine can reach (no GPU, no launcher).
void expect_cli_refuses(const std::vector<std::string>& extra, const std::string& phrase) {
  std::vector<std::string> args = {"run", "--seq-len", "64", "--iters", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  const testing::CliResult r = testing::run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(phrase), std::string::npos) << r.err;
}

TEST(CommChoice, CliRefusesWhatCannotRunHere) {
  expect_cli_refuses({"--comm", "nccl", "--device", "cpu"}, "--comm: 'nccl'");
  expect_cli_refuses({"--comm", "nccl"}, "--comm: 'nccl'");
  expect_cli_refuses({"--comm", "mpi"}, "--comm: 'mpi'");
  expect_cli_refuses({"--comm", "sharedmem"}, "--comm: unknown value 'sharedmem'");
}

TEST(CommChoice, CliLocalRunsOneProcessAndVirtualRanks) {
  for (const char* p : {"1", "2"}) {
    const testing::CliResult r =
        testing::run_cli({"run", "--seq-len", "64", "--heads", "2", "--head-dim", "16", "--iters",
                          "1", "--comm", "local", "--ring-size", p, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("\"world_size\":") + p), std::string::npos) << r.out;
  }
}

// The GPU job's device transport (make_engine): NCCL with a GPU per rank, device copies for
// virtual ranks sharing GPUs, --comm honoured or refused by name.
TEST(DeviceTransport, AutoIsNcclWithAGpuPerRankAndDeviceCopiesForSharedGpus) {
  EXPECT_EQ(choose_device_transport({"auto", 1, false, 1}), DeviceTransport::none);
  EXPECT_EQ(choose_device_transport({"auto", 4, false, 1}), DeviceTransport::nccl);
  EXPECT_EQ(choose_device_transport({"auto", 4, true, 4}), DeviceTransport::nccl);
  EXPECT_EQ(choose_device_transport({"auto", 4, true, 1}), DeviceTransport::device_copies);
  EXPECT_EQ(choose_device_transport({"local", 2, true, 2}), DeviceTransport::device_copies);
  EXPECT_EQ(choose_device_transport({"nccl", 2, false, 8}), DeviceTransport::nccl);
  EXPECT_EQ(device_of_rank(DeviceTransport::device_copies, 5, 0, 2), 1);
  EXPECT_EQ(device_of_rank(DeviceTransport::nccl, 5, 3, 8), 3);
  EXPECT_EQ(device_of_rank(DeviceTransport::nccl, 5, 3, 1), 0);
}

TEST(DeviceTransport, RequestsThatCannotMoveDeviceMemoryAreRefusedNamingComm) {
  for (const DeviceTransportContext& c :
       {DeviceTransportContext{"mpi", 2, false, 2}, DeviceTransportContext{"local", 2, false, 2},
        DeviceTransportContext{"nccl", 4, true, 1}}) {
    try {
      (void)choose_device_transport(c);
      ADD_FAILURE() << "--comm " << c.requested << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "transport") << e.what();  // the JobSpec field; the CLI's --comm
      EXPECT_EQ(option_of(e.subject()), "--comm") << e.what();
      EXPECT_NE(std::string(e.what()).find("'" + c.requested + "'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ringattn::cli
