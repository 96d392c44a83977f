// The GPU ring (label `gpu`; `gpu-emu` on the emulated GPU): P = 1..4 virtual ranks, each on
// its own device, K/V over NCCL, the golden cases and the randomized ring configs (segments
// straddling shards, both combine modes, causal zigzag, D 16 to 128), forward and gradients
// against the float64 reference of the inputs as the devices hold them, in bf16 and one case
// each in fp16 and fp32; the forward's K/V bytes equal the independent minimum; two runs
// give the same bits. With fewer devices than ranks, the ranks share device 0 (the in-process
// device communicator), as the CLI does; only the test comparing that with NCCL needs P GPUs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#if RINGATTN_CUDA_EMULATION
#include "emu/runtime.hpp"
#endif
#include "core/patterns.hpp"
#include "golden.hpp"
#include "gpu_skip.hpp"
#include "kernels/cuda/hopper/dense_backward.hpp"  // hopper_wide_backward_chosen
#include "random.hpp"
#include "ring/cuda_ring_engine.hpp"
#include "ring/inproc_communicator.hpp"
#include "ring/nccl_communicator.hpp"
#include "ring/sharding.hpp"
#include "ring_compare.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/reference.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn {
namespace {

using testing::RingInputs;

struct Full : testing::FullResult {
  std::vector<int64_t> bytes_sent, bytes_min;
  std::vector<std::size_t> workspace;  // device bytes each rank's plan holds
  std::string kernel;                  // rank 0's forward kernel
  std::string kernel_backward;         // and its backward kernel
  std::vector<std::string> notes;      // rank 0's, after the calls
};

// Runs the GPU ring on P virtual ranks (rank r on device r) and gathers the full tensors.
// With `one_device`, every rank uses device 0 and the in-process device communicator.
Full run_gpu_ring(const AttentionConfig& cfg, const RingInputs& in, int p, DeviceDType t,
                  ring::RingOptions ring_opts = {}, bool one_device = false,
                  KernelChoice kernel = KernelChoice::native, bool deterministic = false) {
  const Shape4 s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());                   // q, dq
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());   // k, dk
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());     // v, dv
  const auto n_o = static_cast<std::size_t>(cfg.out_shape().numel());   // out, dout
  Full f{{std::vector<float>(n_o),
          std::vector<float>(static_cast<std::size_t>(s.batch * s.heads * s.seq_len)),
          std::vector<float>(n), std::vector<float>(n_kv), std::vector<float>(n_v)},
         std::vector<int64_t>(static_cast<std::size_t>(p)),
         std::vector<int64_t>(static_cast<std::size_t>(p)),
         std::vector<std::size_t>(static_cast<std::size_t>(p)),
         {},
         {},
         {}};
  std::mutex mu;
  const int rc = ring::run_virtual_ranks(p, [&](ring::Communicator& control) {
    const int r = one_device ? 0 : control.rank();
    auto comm = one_device ? ring::make_device_inproc_communicator(control, 0)
                           : ring::make_nccl_communicator(control, {60});
    ring::CudaRingPlan plan(cfg, *comm, {t, kernel, r, deterministic}, ring_opts);
    const ring::ShardLayout& l = plan.layout();
    const int64_t dv_cols = cfg.effective_head_dim_v();
    const int64_t inner = s.heads * s.head_dim, o_inner = s.heads * dv_cols;
    const int64_t kv_inner = cfg.effective_kv_heads() * s.head_dim;
    const int64_t v_inner = cfg.effective_kv_heads() * dv_cols;
    const auto ln = static_cast<std::size_t>(s.batch * l.local_len * inner);
    const auto lo_n = static_cast<std::size_t>(s.batch * l.local_len * o_inner);
    const auto lnk = static_cast<std::size_t>(s.batch * l.local_len * kv_inner);
    const auto lnv = static_cast<std::size_t>(s.batch * l.local_len * v_inner);
    const auto lrows = static_cast<std::size_t>(s.batch * s.heads * l.local_len);
    auto to_device = [&](const std::vector<float>& full, int64_t row, const char* what) {
      const auto count = static_cast<std::size_t>(s.batch * l.local_len * row);
      std::vector<float> local(count);
      ring::extract_rows(l, control.rank(), s.batch, row, full.data(), local.data());
      DeviceBuffer b(count * bytes_per_element(t), what, r);
      b.upload(local.data(), count, t);
      return b;
    };
    DeviceBuffer q = to_device(in.q, inner, "q"), k = to_device(in.k, kv_inner, "k"),
                 v = to_device(in.v, v_inner, "v"), dout = to_device(in.dout, o_inner, "dout");
    DeviceBuffer out(lo_n * 4, "out", r), lse(lrows * 4, "lse", r), dq(ln * 4, "dq", r),
        dk(lnk * 4, "dk", r), dv(lnv * 4, "dv", r);
    plan.forward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>());
    plan.backward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>(), dout.data(),
                  dq.as<float>(), dk.as<float>(), dv.as<float>());
    plan.synchronize();
    std::vector<float> lo(lo_n), llse(lrows), ldq(ln), ldk(lnk), ldv(lnv);
    out.download(lo.data(), lo_n);
    lse.download(llse.data(), lrows);
    dq.download(ldq.data(), ln);
    dk.download(ldk.data(), lnk);
    dv.download(ldv.data(), lnv);
    std::lock_guard lock(mu);
    ring::insert_rows(l, control.rank(), s.batch, o_inner, lo.data(), f.out.data());
    ring::insert_lse(l, control.rank(), s.batch, s.heads, llse.data(), f.lse.data());
    ring::insert_rows(l, control.rank(), s.batch, inner, ldq.data(), f.dq.data());
    ring::insert_rows(l, control.rank(), s.batch, kv_inner, ldk.data(), f.dk.data());
    ring::insert_rows(l, control.rank(), s.batch, v_inner, ldv.data(), f.dv.data());
    const auto me = static_cast<std::size_t>(control.rank());
    f.bytes_sent[me] = plan.last_forward().bytes_sent;
    f.workspace[me] = plan.workspace_bytes();
    if (me == 0) {
      f.kernel = plan.kernel_name();
      f.kernel_backward = plan.backward_kernel_name();
      f.notes = plan.notes();
    }
    // The minimum is counted in fp32 K/V; the ring moves them in the device dtype.
    f.bytes_min[me] = ring::minimum_bytes_sent(cfg, l, control.rank()) *
                      static_cast<int64_t>(bytes_per_element(t)) / 4;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  return f;
}

// With fewer devices than ranks the ranks share device 0 through the in-process device
// communicator (what the CLI does there); only the NCCL-versus-shared comparison needs P GPUs.
std::string skip_reason(int p, bool needs_one_gpu_per_rank = false) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) return gpu.reason;
  if (needs_one_gpu_per_rank && gpu.device_count < p)
    return "needs " + std::to_string(p) + " GPUs, one per rank (this machine has " +
           std::to_string(gpu.device_count) + ")";
  return "";
}

bool ranks_share_a_device(int p) { return probe_cuda_device().device_count < p; }

// Returns the run (its kernels and notes). `kernels_by_rule`: the kernel names follow from the
// choice alone (not from auto's timing or per-step refusals), so they are checked here.
Full expect_matches_reference(const std::string& what, const AttentionConfig& cfg, RingInputs in,
                              int p, DeviceDType t, ring::RingOptions ring_opts = {},
                              KernelChoice kernel = KernelChoice::native,
                              bool deterministic = false, bool kernels_by_rule = true) {
  const bool shared = ranks_share_a_device(p);
  const bool partials = ring_opts.step_results == ring::RingOptions::StepResults::partials;
  const Full got = run_gpu_ring(cfg, in, p, t, ring_opts, shared, kernel, deterministic);
  if (kernels_by_rule) {
#if RINGATTN_CUDA_EMULATION
    const int64_t d = cfg.shape.head_dim, dv = cfg.effective_head_dim_v();
    const bool hopper_asked = kernel == KernelChoice::hopper ||
                              (kernel == KernelChoice::automatic && t != DeviceDType::fp32);
    // (values of their own head dim: the sm_90a kernels at 192/128 only; it and a soft-cap:
    // auto leaves the sm_90a kernels out until a GPU has passed them with one)
    const bool hopper_dims =
        (dv == d && (d == 64 || d == 128 || d == 256)) || (d == 192 && dv == 128);
    const bool hopper_takes =
        hopper_dims && !((cfg.softcapped() || dv != d) && kernel == KernelChoice::automatic);
    if (hopper_asked && hopper_takes) {
      EXPECT_EQ(got.kernel, "hopper") << what << " P=" << p;  // the emulated GPUs are sm_90s
      EXPECT_EQ(testing::kernel_family(got.kernel_backward), "hopper") << what << " P=" << p;
      if (kernel == KernelChoice::hopper &&
          kernels::cuda::hopper_wide_backward_chosen(deterministic, static_cast<int>(d))) {
        EXPECT_EQ(got.kernel_backward, "hopper-fused-wide") << what << " P=" << p;
      }
    }
#endif
  if (kernel == KernelChoice::cudnn) {  // every view is a cuDNN grid in these cases
    EXPECT_EQ(got.kernel, "cudnn") << what << " P=" << p;
    EXPECT_EQ(got.kernel_backward, "cudnn") << what << " P=" << p;
  }
  }
  for (std::vector<float>* x : {&in.q, &in.k, &in.v, &in.dout})
    round_to_device_dtype(x->data(), x->size(), t);
  const ReferenceForward ref = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients g =
      reference_backward(cfg, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  const double tol = t == DeviceDType::fp32 ? 1e-4 : 1e-2;
  const double e[5] = {relative_error(got.out.data(), ref.out.data(), got.out.size()),
                       relative_error(got.lse.data(), ref.lse.data(), got.lse.size()),
                       relative_error(got.dq.data(), g.dq.data(), got.dq.size()),
                       relative_error(got.dk.data(), g.dk.data(), got.dk.size()),
                       relative_error(got.dv.data(), g.dv.data(), got.dv.size())};
  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; ++i) EXPECT_LE(e[i], tol) << what << " P=" << p << ": " << names[i];
  // And the CPU engine's answer on the same (rounded) inputs, which the CPU ring equals within
  // 1e-5 at every P (test_ring_virtual, test_ring_mpi).
  const testing::FullResult cpu = testing::single_process(cfg, in);
  const std::pair<const std::vector<float>*, const std::vector<float>*> pairs[5] = {
      {&got.out, &cpu.out},
      {&got.lse, &cpu.lse},
      {&got.dq, &cpu.dq},
      {&got.dk, &cpu.dk},
      {&got.dv, &cpu.dv}};
  for (int i = 0; i < 5; ++i)
    EXPECT_LE(
        relative_error(pairs[i].first->data(), pairs[i].second->data(), pairs[i].first->size()),
        tol)
        << what << " P=" << p << ": " << names[i] << " against the CPU engine";
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(got.bytes_sent[static_cast<std::size_t>(r)],
              got.bytes_min[static_cast<std::size_t>(r)])
        << what << " P=" << p << " rank " << r;
  // The memory bound (docs/COMMUNICATION.md): two send, two receive, two partial and two
  // return buffers, each at most one shard's K and V rows (B·n·H rows of D + Dv), plus D and
  // the lists; nothing grows with N·P.
  const Shape4& s = cfg.shape;
  const auto shard_rows = static_cast<std::size_t>(s.batch * (s.seq_len / p) * s.heads);
  const std::size_t eb = bytes_per_element(t);
  const auto kv_cols = static_cast<std::size_t>(s.head_dim + cfg.effective_head_dim_v());
  const auto dv_cols = static_cast<std::size_t>(cfg.effective_head_dim_v());
  // With per-step partials, one more shard's out and lse (fp32).
  const std::size_t bound = 2 * shard_rows * kv_cols * (eb + eb + 4 + 4) + shard_rows * 4 +
                            (std::size_t{1} << 20) +
                            (partials ? shard_rows * (dv_cols + 1) * 4 : 0);
  for (int r = 0; r < p; ++r)
    EXPECT_LE(got.workspace[static_cast<std::size_t>(r)], bound)
        << what << " P=" << p << " rank " << r;
  std::printf(
      "  %s P=%d%s %s %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e, rank 0 sent %lld bytes\n",
      what.c_str(), p, shared ? " (one GPU)" : "", got.kernel.c_str(), to_string(t), e[0], e[1],
      e[2], e[3], e[4], static_cast<long long>(got.bytes_sent[0]));
  return got;
}

class CudaRingGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaRingGolden, EveryRankCountMatchesTheReference) {
  const testing::GoldenCase c = testing::load_golden(GetParam());
  for (int p = 1; p <= 4; ++p) {
    if (c.cfg.shape.seq_len % p != 0) continue;  // causal N % 2P != 0: balanced layout
    if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    expect_matches_reference(c.name, c.cfg, {c.q, c.k, c.v, c.dout}, p, DeviceDType::bf16);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaRingGolden, ::testing::ValuesIn(testing::ring_golden_cases()),
                         [](const auto& p) { return p.param; });

struct RingCase {
  testing::RandomRingCase c;
  bool causal;
};

std::string name_of(const RingCase& rc) {
  return std::string(rc.c.name) + (rc.causal ? "_causal" : "");
}
// gtest prints parameters into the discovered test names; without this it would print the
// struct's raw bytes (pointers included), which change from build to build.
void PrintTo(const RingCase& rc, std::ostream* os) { *os << name_of(rc); }

class CudaRingRandom : public ::testing::TestWithParam<RingCase> {};

TEST_P(CudaRingRandom, EveryRankCountMatchesTheReference) {
  const RingCase& rc = GetParam();
  const AttentionConfig cfg = testing::config_of(rc.c, rc.causal);
  const RingInputs in = testing::random_inputs(cfg);
  const std::string what = std::string(rc.c.name) + (rc.causal ? "_causal" : "");
  for (int p = 1; p <= 4; ++p) {
    if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    expect_matches_reference(what, cfg, in, p, DeviceDType::bf16);
  }
  // The other dtypes once each, at P = 3.
  if (rc.c.attention == AttentionKind::dense)
    expect_matches_reference(what, cfg, in, 3, rc.causal ? DeviceDType::fp32 : DeviceDType::fp16);
}

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> v;
  for (bool causal : {false, true})
    for (const auto& c : testing::random_ring_cases()) v.push_back({c, causal});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Random, CudaRingRandom, ::testing::ValuesIn(ring_cases()),
                         [](const auto& p) { return name_of(p.param); });

// D = 256 (the largest head dim; 99 KiB of shared memory on an sm_86 falls back to fp32 there):
// dense causal and dilated grouped, N = 96 splitting over 2P for zigzag at every P.
TEST(CudaRing, HeadDim256MatchesTheReference) {
  for (bool dilated : {false, true}) {
    AttentionConfig cfg;
    cfg.shape = {1, 96, 2, 256};
    cfg.causal = !dilated;
    if (dilated) {
      cfg.attention = AttentionKind::dilated;
      cfg.segments = {48, 96};
      cfg.dilations = {1, 2};
    }
    const RingInputs in = testing::random_inputs(cfg);
    for (int p = 1; p <= 4; ++p) {
      if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
      expect_matches_reference(dilated ? "D256_dilated" : "D256_causal", cfg, in, p,
                               DeviceDType::bf16);
    }
  }
}

// Virtual ranks sharing one GPU (NCCL refuses that): the in-process device communicator
// gives the same bits as NCCL between distinct GPUs, and matches the reference.
TEST(CudaRing, VirtualRanksOnOneGpuGiveTheSameBitsAsNcclOnSeveral) {
  if (const std::string why = skip_reason(3, true); !why.empty())
    GTEST_SKIP() << "SKIPPED: " << why;
  for (bool causal : {false, true}) {
    AttentionConfig cfg = testing::config_of(testing::random_ring_cases()[1], causal);
    const RingInputs in = testing::random_inputs(cfg);
    const Full nccl = run_gpu_ring(cfg, in, 3, DeviceDType::bf16);
    const Full shared = run_gpu_ring(cfg, in, 3, DeviceDType::bf16, {}, true);
    for (auto [x, y, name] : {std::tuple{&nccl.out, &shared.out, "out"},
                              {&nccl.lse, &shared.lse, "lse"},
                              {&nccl.dq, &shared.dq, "dq"},
                              {&nccl.dk, &shared.dk, "dk"},
                              {&nccl.dv, &shared.dv, "dv"}})
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0)
          << name << (causal ? " causal" : "");
    EXPECT_EQ(nccl.bytes_sent, shared.bytes_sent);
  }
}

// Several transfers to one peer in one exchange (distributed block-sparse sends K and V
// apart) arrive in the order they were posted, with ranks sharing one GPU through device
// copies. Found on an H100: a receive that found nothing let the next receive from the same
// source take its send, swapping K and V when the sender posted in between. Many rounds with
// the sender a few microseconds late give that interleaving its chance.
TEST(CudaRing, SharedDeviceCopiesKeepEachSourcesOrder) {
  if (const std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  constexpr int kParts = 4, kRounds = 300;
  constexpr std::size_t kFloats = 64;
  std::atomic<int> wrong{0};
  const int rc = ring::run_virtual_ranks(2, [&](ring::Communicator& control) {
    auto comm = ring::make_device_inproc_communicator(control, 0);
    const int me = control.rank(), peer = 1 - me;
    std::vector<DeviceBuffer> out, in;
    for (int i = 0; i < kParts; ++i) {
      out.emplace_back(kFloats * 4, "send part", 0);
      in.emplace_back(kFloats * 4, "receive part", 0);
    }
    std::vector<float> host(kFloats);
    for (int round = 0; round < kRounds; ++round) {
      for (int i = 0; i < kParts; ++i) {
        std::fill(host.begin(), host.end(), static_cast<float>(1000 * round + 10 * me + i));
        out[static_cast<std::size_t>(i)].upload(host.data(), kFloats, DeviceDType::fp32);
      }
      std::vector<ring::Transfer> sends, recvs;
      for (int i = 0; i < kParts; ++i) {
        sends.push_back({peer, out[static_cast<std::size_t>(i)].data(), kFloats * 4});
        recvs.push_back({peer, in[static_cast<std::size_t>(i)].data(), kFloats * 4});
      }
      // Rank 1 posts late on odd rounds, rank 0 on even ones.
      if ((round + me) % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(round % 40));
      auto ex = comm->start(sends, recvs, 7);
      while (!ex->test()) {
      }
      for (int i = 0; i < kParts; ++i) {
        in[static_cast<std::size_t>(i)].download(host.data(), kFloats);
        if (host[0] != static_cast<float>(1000 * round + 10 * peer + i)) ++wrong;
      }
      control.barrier();
    }
    return 0;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(wrong.load(), 0) << "transfers from one source arrived out of order";
}

// Grouped-query attention (only K/V heads travel), sliding windows (only ranks within reach
// exchange) and packed documents (the balanced layout at P = 4 for N = 252) on the GPU ring,
// P = 1..4, forward and gradients against float64, bytes equal to the minimum.
class CudaRingFeatures : public ::testing::TestWithParam<RingCase> {};

TEST_P(CudaRingFeatures, EveryRankCountMatchesTheReference) {
  const RingCase& rc = GetParam();
  const AttentionConfig cfg = testing::config_of(rc.c, rc.causal);
  const RingInputs in = testing::random_inputs(cfg);
  for (int p = 1; p <= 4; ++p) {
    if (cfg.shape.seq_len % p != 0) continue;
    if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    expect_matches_reference(name_of(rc), cfg, in, p, DeviceDType::bf16);
  }
}

std::vector<RingCase> feature_ring_cases() {
  std::vector<RingCase> v;
  std::vector<testing::RandomRingCase> picked;
  for (const auto& c : testing::gqa_ring_cases()) picked.push_back(c);
  for (const auto& c : testing::window_ring_cases())
    if (std::string(c.name) == "window_7" || std::string(c.name) == "window_70_gqa" ||
        std::string(c.name) == "window_3_90")
      picked.push_back(c);
  for (const auto& c : testing::packed_ring_cases())
    if (std::string(c.name) != "packed_singletons") picked.push_back(c);
  for (bool causal : {false, true})
    for (const auto& c : picked) v.push_back({c, causal});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Features, CudaRingFeatures, ::testing::ValuesIn(feature_ring_cases()),
                         [](const auto& p) { return name_of(p.param); });

// The ring's seam for a library kernel that cannot merge (cuDNN): each step's attention
// written whole into a partial (out, lse) and merged in by the device lse merge, the native
// kernels standing in for cuDNN; P = 1..4 against float64 and the CPU engine, dense, causal
// (the zigzag's diagonal and off-diagonal steps), dilated grouped and mixture, GQA, a
// window and packed documents. The backward already takes the global out and lse.
class CudaRingPartials : public ::testing::TestWithParam<RingCase> {};

TEST_P(CudaRingPartials, EveryRankCountMatchesTheReference) {
  const RingCase& rc = GetParam();
  const AttentionConfig cfg = testing::config_of(rc.c, rc.causal);
  const RingInputs in = testing::random_inputs(cfg);
  ring::RingOptions opts;
  opts.step_results = ring::RingOptions::StepResults::partials;
  for (int p = 1; p <= 4; ++p) {
    if (cfg.shape.seq_len % p != 0) continue;
    if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    expect_matches_reference(name_of(rc) + " (partials)", cfg, in, p, DeviceDType::bf16, opts);
  }
}

std::vector<RingCase> partial_ring_cases() {
  std::vector<RingCase> v;
  const std::vector<std::string> wanted = {"dense_D64",          "grouped_straddling",
                                           "mixture_straddling", "gqa_grouped_straddling",
                                           "window_3_90",        "packed_mixed"};
  std::vector<testing::RandomRingCase> all = testing::random_ring_cases();
  for (const auto& c : testing::gqa_ring_cases()) all.push_back(c);
  for (const auto& c : testing::window_ring_cases()) all.push_back(c);
  for (const auto& c : testing::packed_ring_cases()) all.push_back(c);
  for (const auto& c : all)
    for (const std::string& w : wanted)
      if (w == c.name)
        for (bool causal : {false, true}) v.push_back({c, causal});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Partials, CudaRingPartials, ::testing::ValuesIn(partial_ring_cases()),
                         [](const auto& p) { return name_of(p.param); });

// --kernel hopper: every step's forward and backward on the sm_90a task kernels (the rank's own
// K/V at step 0, the packed receive buffer and its dK/dV partial after), the forward merged in
// place or through per-step partials; P = 1..4 against float64 and the CPU engine (gradients
// included): dense, causal (zigzag),
// dilated mixture, GQA, a window and packed documents, each at D = 64.
class CudaRingHopper : public ::testing::TestWithParam<RingCase> {};

TEST_P(CudaRingHopper, EveryRankCountMatchesTheReference) {
  const RingCase& rc = GetParam();
  AttentionConfig cfg = testing::config_of(rc.c, rc.causal);
  // A head dim the Hopper kernels have: 64, or the wide fused kernel's 128 where it is asked
  // for (RINGATTN_HOPPER_BWD=fused_wide: ctest hopper_ring_backward_fused_wide).
  cfg.shape.head_dim = kernels::cuda::hopper_wide_backward_chosen(false, 128) ? 128 : 64;
  const RingInputs in = testing::random_inputs(cfg);
  // Under a fused form (ctest hopper_ring_backward_fused, _wide) two and three ranks: every
  // kind of step (the rank's own diagonal block, received ones whole and cut); the discovered
  // run takes P = 1..4 on the two passes.
  const bool fused =
      kernels::cuda::hopper_fused_backward_chosen(false, static_cast<int>(cfg.shape.head_dim));
  for (int p = 1; p <= 4; ++p) {
    if (cfg.shape.seq_len % p != 0 || (fused && (p == 1 || p == 4))) continue;
    if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    expect_matches_reference(name_of(rc) + " (hopper)", cfg, in, p, DeviceDType::bf16, {},
                             KernelChoice::hopper);
    if (std::string(rc.c.name) == "dense_D64" && rc.causal) {
      ring::RingOptions opts;
      opts.step_results = ring::RingOptions::StepResults::partials;
      expect_matches_reference(name_of(rc) + " (hopper, partials)", cfg, in, p, DeviceDType::bf16,
                               opts, KernelChoice::hopper);
      if (p == 2) {  // D = 256 (its dV and dK as two launches a step), on two ranks
        AttentionConfig wide = cfg;
        wide.shape.head_dim = 256;
        expect_matches_reference(name_of(rc) + " (hopper, D=256)", wide,
                                 testing::random_inputs(wide), p, DeviceDType::bf16, {},
                                 KernelChoice::hopper);
      }
    }
  }
}

std::vector<RingCase> hopper_ring_cases() {
  std::vector<RingCase> v;
  const std::vector<std::pair<std::string, bool>> wanted = {
      {"dense_D64", false},   {"dense_D64", true},   {"mixture_straddling", true},
      {"gqa_grouped_straddling", false}, {"window_3_90", true}, {"packed_mixed", true}};
  std::vector<testing::RandomRingCase> all = testing::random_ring_cases();
  for (const auto& c : testing::gqa_ring_cases()) all.push_back(c);
  for (const auto& c : testing::window_ring_cases()) all.push_back(c);
  for (const auto& c : testing::packed_ring_cases()) all.push_back(c);
  for (const auto& [name, causal] : wanted)
    for (const auto& c : all)
      if (name == c.name) v.push_back({c, causal});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Hopper, CudaRingHopper, ::testing::ValuesIn(hopper_ring_cases()),
                         [](const auto& p) { return name_of(p.param); });

// Values of their own head dim (MLA: K rows of D and V rows of Dv back to back in each packed
// buffer, the dK/dV partials alike, bytes still the minimum) and soft-capped logits on the GPU
// ring: P = 1..4 against float64 and the CPU engine, forward and every gradient, under
// --kernel auto (the native kernels: the sm_90a ones compute Dv != D at 192/128 only, and auto
// leaves them out for that and for a cap until a GPU has passed them with one; the notes say
// so), through per-step partials for two cases, in fp32 for one; the 192/128 cases and the
// capped ones at D = 64 also under --kernel hopper (the sm_90a task kernels compute both,
// saying no GPU has run them so). A capped case
// must differ from its uncapped reference by more than ten times the tolerance, so that the
// cap is what is checked.
class CudaRingMlaSoftcap : public ::testing::TestWithParam<RingCase> {};

TEST_P(CudaRingMlaSoftcap, EveryRankCountMatchesTheReference) {
  const RingCase& rc = GetParam();
  const AttentionConfig cfg = testing::config_of(rc.c, rc.causal);
  const RingInputs in = testing::random_inputs(cfg);
  if (cfg.softcapped()) {
    AttentionConfig uncapped = cfg;
    uncapped.softcap = 0;
    const ReferenceForward a = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
    const ReferenceForward b = reference_forward(uncapped, in.q.data(), in.k.data(), in.v.data());
    const std::vector<float> a32(a.out.begin(), a.out.end());
    EXPECT_GT(relative_error(a32.data(), b.out.data(), a32.size()), 10 * 1e-2)
        << "the cap does not change " << name_of(rc) << "'s answer";
  }
  const bool partials_too = std::string(rc.c.name) == "mla_192_128" ||
                            std::string(rc.c.name) == "cap30_mla_40_24_packed";
  for (int p = 1; p <= 4; ++p) {
    if (cfg.shape.seq_len % p != 0) continue;
    if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    const Full got = expect_matches_reference(name_of(rc) + " (auto)", cfg, in, p,
                                              DeviceDType::bf16, {}, KernelChoice::automatic);
    EXPECT_EQ(got.kernel, "native") << name_of(rc) << " P=" << p;
    EXPECT_EQ(got.kernel_backward, "native") << name_of(rc) << " P=" << p;
    const std::string all = ::testing::PrintToString(got.notes);
    EXPECT_NE(all.find("which no GPU has run yet"), std::string::npos) << all;
    const int64_t d = cfg.shape.head_dim, dv = cfg.effective_head_dim_v();
    const bool mla_pair = d == 192 && dv == 128;
#if RINGATTN_CUDA_EMULATION  // the emulated GPUs are sm_90s: the sm_90a kernels say why not
    EXPECT_NE(all.find(dv != d && !mla_pair
                           ? "the sm_90a ones cannot run: they compute values of their own head "
                             "dim at 192/128 only"
                       : dv != d ? "the sm_90a ones cannot run: kernel=auto leaves out the sm_90a "
                                   "kernels with values of their own head dim (192/128)"
                                 : "the sm_90a ones cannot run: kernel=auto leaves out the sm_90a "
                                   "kernels' soft-cap"),
              std::string::npos)
        << all;
#endif
    // --kernel hopper computes 192/128 and the cap on the sm_90a task kernels (the cap at
    // D = 64 here), saying that no GPU has run them so.
    if ((cfg.softcapped() && dv == d && d == 64) || mla_pair) {
      const Full h = expect_matches_reference(name_of(rc) + " (hopper)", cfg, in, p,
                                              DeviceDType::bf16, {}, KernelChoice::hopper);
      EXPECT_EQ(h.kernel, "hopper") << name_of(rc) << " P=" << p;
      // (hopper-fused under RINGATTN_HOPPER_BWD=fused: ctest hopper_ring_value_dim_backward_fused)
      EXPECT_EQ(testing::kernel_family(h.kernel_backward), "hopper") << name_of(rc) << " P=" << p;
      const std::string hn = ::testing::PrintToString(h.notes);
#if RINGATTN_CUDA_EMULATION
      if (cfg.softcapped()) {
        EXPECT_NE(
            hn.find("kernel=hopper runs the sm_90a kernels' soft-cap, unverified on hardware"),
            std::string::npos)
            << hn;
      }
      if (mla_pair) {
        EXPECT_NE(hn.find("kernel=hopper runs the sm_90a kernels with values of their own head "
                          "dim (192/128), unverified on hardware"),
                  std::string::npos)
            << hn;
      }
#endif
    }
    if (partials_too && p >= 2) {
      ring::RingOptions opts;
      opts.step_results = ring::RingOptions::StepResults::partials;
      expect_matches_reference(name_of(rc) + " (partials)", cfg, in, p, DeviceDType::bf16, opts);
    }
    if (std::string(rc.c.name) == "mla_64_32_window" && p == 3)
      expect_matches_reference(name_of(rc), cfg, in, p, DeviceDType::fp32);
  }
}

std::vector<RingCase> mla_softcap_cuda_ring_cases() {
  std::vector<RingCase> v;
  bool causal = true;
  for (const auto& c : testing::mla_softcap_ring_cases()) {
    v.push_back({c, causal});
    causal = !causal;
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(MlaSoftcap, CudaRingMlaSoftcap,
                         ::testing::ValuesIn(mla_softcap_cuda_ring_cases()),
                         [](const auto& p) { return name_of(p.param); });

#if RINGATTN_TEST_HAVE_CUDNN || RINGATTN_CUDA_EMULATION
// --kernel cudnn with values of their own head dim or a cap: every step's views on cuDNN's
// graphs (V and O of their own width in the shard and in the packed receive buffer, the cap
// as its score modifier with each step's band inside it), P = 1..4 against float64 and the
// CPU engine, with the notes that these graphs are unverified on hardware; under --kernel auto
// they are left out (a form of their own in verified_forms.hpp) even where the ring's cuDNN
// steps are admitted.
TEST(CudaRing, CudnnStepsRunValueHeadDimAndSoftcapAgainstTheReference) {
  if (const std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
  for (const auto& c : testing::mla_softcap_ring_cases()) {
    const std::string name = c.name;
    if (name != "mla_64_32_window" && name != "cap1_dense" && name != "cap30_mla_40_24_packed")
      continue;
    const AttentionConfig cfg = testing::config_of(c, true);
    const RingInputs in = testing::random_inputs(cfg);
    for (int p = 1; p <= 4; ++p) {
      if (cfg.shape.seq_len % p != 0) continue;
      const Full got = expect_matches_reference(name + " (cudnn)", cfg, in, p, DeviceDType::bf16,
                                                {}, KernelChoice::cudnn, false, false);
      const std::string all = ::testing::PrintToString(got.notes);
#if RINGATTN_CUDA_EMULATION  // a GPU's cuDNN may refuse a step's graph (its note says why)
      EXPECT_EQ(got.kernel, "cudnn") << name << " P=" << p << all;
      EXPECT_EQ(got.kernel_backward, "cudnn") << name << " P=" << p << all;
#endif
      EXPECT_NE(all.find("kernel=cudnn runs cuDNN's graphs with values of their own head dim or a "
                         "soft-cap score modifier, unverified on hardware"),
                std::string::npos)
          << all;
    }
    const testing::EnvScope verified("RINGATTN_TEST_VERIFIED_FORMS", "cudnn_ring_steps");
    const Full automatic = run_gpu_ring(cfg, in, 2, DeviceDType::bf16, {}, true,
                                        KernelChoice::automatic);
    EXPECT_EQ(automatic.kernel, "native") << name;
    const std::string all = ::testing::PrintToString(automatic.notes);
    EXPECT_NE(all.find("kernel=auto leaves out cuDNN"), std::string::npos) << all;
#if RINGATTN_CUDA_EMULATION  // where the ring's cuDNN steps are admitted, these graphs still not
    EXPECT_NE(all.find("kernel=auto leaves out cuDNN's graphs with values of their own head dim"),
              std::string::npos)
        << all;
#endif
  }
}
#endif

// --kernel auto on the ring: the sm_90a kernels where they run (bf16 on the emulated sm_90s,
// checked against float64 and the CPU engine), the native ones in fp32, each with a note.
TEST(CudaRing, AutoRunsTheSm90aKernelsWhereTheyRunElseTheNativeOnes) {
  if (const std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  AttentionConfig cfg;
  for (const auto& c : testing::random_ring_cases())
    if (std::string(c.name) == "dense_D64") cfg = testing::config_of(c, true);
  ASSERT_EQ(cfg.shape.head_dim, 64);
  const RingInputs in = testing::random_inputs(cfg);
  expect_matches_reference("auto bf16", cfg, in, 2, DeviceDType::bf16, {},
                           KernelChoice::automatic);
  for (const DeviceDType t : {DeviceDType::bf16, DeviceDType::fp32}) {
    std::vector<std::string> notes;
    std::string kernel;
    const int rc = ring::run_virtual_ranks(1, [&](ring::Communicator& control) {
      auto comm = ring::make_device_inproc_communicator(control, 0);
      ring::CudaRingPlan plan(cfg, *comm, {t, KernelChoice::automatic, 0}, {});
      notes = plan.notes();
      kernel = plan.kernel_name();
      return 0;
    });
    ASSERT_EQ(rc, 0);
    const std::string all = ::testing::PrintToString(notes);
    if (kernel == "hopper") {
      EXPECT_NE(all.find("kernel=auto: every ring step's forward and backward on the sm_90a"),
                std::string::npos)
          << all;
    } else {
      EXPECT_NE(all.find("kernel=auto: the native kernels"), std::string::npos) << all;
    }
#if RINGATTN_CUDA_EMULATION
    EXPECT_EQ(kernel, t == DeviceDType::fp32 ? "native" : "hopper") << all;
#endif
  }
}

#if RINGATTN_TEST_HAVE_CUDNN || RINGATTN_CUDA_EMULATION
// --kernel cudnn: every step's views on cuDNN's graphs, the forward merged by lse (in place
// and through per-step partials), the backward from the global out and lse; P = 1..4 against
// float64: dense and causal (zigzag at N = 240, balanced at N = 252 and P = 4), MQA and GQA
// 6:3, D = 64 and 128. On a GPU with cuDNN (label gpu); on the emulated GPU (gpu-emu) with cuDNN's
// stand-in (cudnn/graphs_emulated.cpp, a reference of its SDPA contract), so that the views,
// epilogues and gradient adds around it run on every commit.
TEST(CudaRing, CudnnRunsEveryStepsViewsAgainstTheReference) {
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
  std::vector<std::pair<AttentionConfig, std::string>> cases;
  for (const auto& c : testing::random_ring_cases())
    if (std::string(c.name) == "dense_D64")
      for (const bool causal : {false, true})
        cases.emplace_back(testing::config_of(c, causal), causal ? "causal" : "dense");
  for (const auto& c : testing::gqa_ring_cases())
    if (std::string(c.name) == "gqa_dense_mqa" || std::string(c.name) == "gqa_dense_half") {
      AttentionConfig cfg = testing::config_of(c, true);
      cfg.shape.head_dim = 64;
      cases.emplace_back(cfg, c.name);
    }
  AttentionConfig wide = cases.at(1).first;
  wide.shape.head_dim = 128;
  cases.emplace_back(wide, "causal D=128");
  AttentionConfig balanced = cases.at(1).first;  // 252 % 2P != 0 at P = 4: the balanced layout,
  balanced.shape.seq_len = 252;                   // chunks of unequal lengths
  cases.emplace_back(balanced, "causal N=252");
  for (const auto& [cfg, name] : cases) {
    const RingInputs in = testing::random_inputs(cfg);
    for (int p = 1; p <= 4; ++p) {
      if (cfg.shape.seq_len % p != 0) continue;
      if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
      expect_matches_reference(name + " (cudnn)", cfg, in, p, DeviceDType::bf16, {},
                               KernelChoice::cudnn);
      if (name == "causal" && p == 2) {
        ring::RingOptions opts;
        opts.step_results = ring::RingOptions::StepResults::partials;
        expect_matches_reference(name + " (cudnn, partials)", cfg, in, p, DeviceDType::bf16, opts,
                                 KernelChoice::cudnn);
      }
    }
  }
}

// Sliding windows and packed documents on the ring through cuDNN's views (a band per
// document, rows that see no key of a step trimmed off), against float64 at P = 1..4: a
// causal window narrower than a chunk, a wider one with GQA, a two-sided window, packed
// documents with a one-token one and documents straddling shards, and a window inside
// documents.
TEST(CudaRing, CudnnRunsWindowsAndPackedDocumentsAgainstTheReference) {
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
  // [batch, 96, 4, 64], K/V heads, causal, window (left, right; -1: none), documents.
  auto config = [](int64_t batch, int64_t kv_heads, bool causal, int64_t left, int64_t right,
                   std::vector<int64_t> cu) {
    AttentionConfig c;
    c.shape = {batch, 96, 4, 64};
    c.kv_heads = kv_heads;
    c.causal = causal;
    if (left >= 0) c.window_left = left;
    if (right >= 0) c.window_right = right;
    c.cu_seqlens = std::move(cu);
    return c;
  };
  const std::pair<AttentionConfig, std::string> cases[] = {
      {config(1, 4, true, 5, -1, {}), "causal window 5"},
      {config(2, 2, true, 40, -1, {}), "causal window 40, GQA 4:2"},
      {config(1, 4, false, 7, 3, {}), "window 7,3"},
      {config(2, 4, true, -1, -1, {0, 1, 30, 31, 70, 96}), "packed, one-token documents"},
      {config(1, 2, true, 9, -1, {0, 40, 41, 96}), "packed with window 9, GQA 4:2"}};
  for (const auto& [cfg, name] : cases) {
    const RingInputs in = testing::random_inputs(cfg);
    for (int p = 1; p <= 4; ++p) {
      if (const std::string why = skip_reason(p); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
      const Full got = expect_matches_reference(name + " (cudnn)", cfg, in, p, DeviceDType::bf16,
                                                {}, KernelChoice::cudnn, false, false);
      EXPECT_EQ(got.kernel, "cudnn") << name << " P=" << p;
#if RINGATTN_CUDA_EMULATION  // cuDNN 9.19 refuses a one-token document's backward (its step's
                             // backward then runs on ours): only the stand-in runs every one
      EXPECT_EQ(got.kernel_backward, "cudnn") << name << " P=" << p;
#endif
    }
  }
}
#endif

#if RINGATTN_TEST_HAVE_CUDNN || RINGATTN_CUDA_EMULATION
using testing::EnvScope;

bool has_note(const Full& f, const std::string& text) {
  return std::any_of(f.notes.begin(), f.notes.end(),
                     [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

// --kernel auto on the ring takes cuDNN's steps for a pass exactly where they time faster
// than ringattn's kernels (timings stubbed: RINGATTN_TEST_RING_AUTO_MS), and never under
// --deterministic; each choice is a note with the times, and the results match float64
// whichever kernels run.
TEST(CudaRing, AutoTakesCudnnStepsWhereTheyTimeFasterAndNeverWhenDeterministic) {
  if (const std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
  AttentionConfig cfg;
  for (const auto& c : testing::random_ring_cases())
    if (std::string(c.name) == "dense_D64") cfg = testing::config_of(c, true);
  const RingInputs in = testing::random_inputs(cfg);
  // Until a committed GPU log shows cuDNN's ring steps passing (verified_forms.hpp), auto
  // leaves them out whatever they would time, and says so.
  using kernels::cuda::GpuForm, kernels::cuda::GpuPath;
  {
    const EnvScope unverified("RINGATTN_TEST_VERIFIED_FORMS", nullptr);
    const EnvScope timing("RINGATTN_TEST_RING_AUTO_MS", "2,1,2,1");
    if (!kernels::cuda::verified_on_gpu(GpuForm::cudnn_ring_steps, GpuPath::ring)) {
      const Full got = expect_matches_reference("auto, cuDNN's steps unverified", cfg, in, 2,
                                                DeviceDType::bf16, {}, KernelChoice::automatic,
                                                false, false);
      const std::string all = ::testing::PrintToString(got.notes);
      EXPECT_NE(got.kernel, "cudnn") << all;
      EXPECT_NE(got.kernel_backward, "cudnn") << all;
      EXPECT_TRUE(has_note(got,
                           "kernel=auto leaves out cuDNN on the ring's steps: no "
                           "committed GPU log shows it passing yet"))
          << all;
      EXPECT_FALSE(has_note(got, " ms, cudnn ")) << all;
#if !RINGATTN_CUDA_EMULATION
      return;  // what follows needs auto to take them
#endif
    }
  }
#if RINGATTN_CUDA_EMULATION
  const EnvScope verified("RINGATTN_TEST_VERIFIED_FORMS", "cudnn_ring_steps");
#endif
  struct Case {
    const char* ms;
    bool deterministic;
    const char *forward, *backward;
  };
  for (const Case& c : {Case{"2,1,1,2", false, "cudnn", "hopper"},
                        Case{"1,2,2,1", false, "hopper", "cudnn"},
                        Case{"1,1,1,1", false, "hopper", "hopper"},  // a tie keeps ours
                        Case{"2,1", true, "hopper", "hopper"}}) {
    const EnvScope timing("RINGATTN_TEST_RING_AUTO_MS", c.ms);
    for (int p : {1, 2}) {
      const std::string what = std::string("auto ") + c.ms + (c.deterministic ? " det" : "");
      const Full got = expect_matches_reference(what, cfg, in, p, DeviceDType::bf16, {},
                                                KernelChoice::automatic, c.deterministic, false);
      // Ours: the sm_90a kernels on the emulated sm_90; on a GPU whichever of ours runs there.
      auto ours_as_one = [](const std::string& k) {
#if RINGATTN_CUDA_EMULATION
        return k;
#else
        return k == "cudnn" ? k : std::string("ours");
#endif
      };
      EXPECT_EQ(ours_as_one(got.kernel), ours_as_one(c.forward)) << what << " P=" << p;
      EXPECT_EQ(ours_as_one(got.kernel_backward), ours_as_one(c.backward)) << what << " P=" << p;
      const std::string all = ::testing::PrintToString(got.notes);
      if (c.deterministic) {
        EXPECT_EQ(all.find("cudnn"), std::string::npos) << all;
      } else {
        EXPECT_TRUE(has_note(got, std::string(" ") + (c.ms[0] == '2' ? "2.000" : "1.000") +
                                      " ms, cudnn "))
            << all;
        EXPECT_TRUE(has_note(got, "using " + got.kernel)) << all;
        EXPECT_TRUE(has_note(got, "kernel=auto: ring backward ")) << all;
      }
    }
  }
}

// --kernel auto times the ring's sm_90a backward in two passes against its fused kernel and
// (D = 128) its wide fused kernel on the first backward, on the slowest rank's times, and
// keeps the fastest (on a GPU; on the emulated one only with RINGATTN_HOPPER_BWD=auto: ctest
// hopper_ring_auto_times_fused_backward), never when deterministic; the backward's kernel
// name says which ran ("hopper-fused", "hopper-fused-wide"), and the
// gradients match float64 whichever form was kept.
TEST(CudaRing, AutoTimesTheFusedSm90aBackwardOnTheSlowestRank) {
  if (const std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  AttentionConfig cfg;
  for (const auto& c : testing::random_ring_cases())
    if (std::string(c.name) == "dense_D64") cfg = testing::config_of(c, true);
  cfg.shape.batch = 1;
  cfg.shape.heads = 2;       // CI time: the emulator runs every timed form six times
  cfg.shape.head_dim = 128;  // where the wide fused kernel is a third form
  const RingInputs in = testing::random_inputs(cfg);
  const std::string env = testing::hopper_bwd_env();
  using kernels::cuda::GpuForm, kernels::cuda::GpuPath;
  const auto verified = [](GpuForm f) { return kernels::cuda::verified_on_gpu(f, GpuPath::ring); };
  const auto run = [&](const std::string& what, int p, bool deterministic) {
    const Full got = expect_matches_reference(what, cfg, in, p, DeviceDType::bf16, {},
                                              KernelChoice::automatic, deterministic, false);
    if (got.kernel_backward.rfind("hopper", 0) != 0) return;  // a GPU without sm_90a
    const bool timed = testing::auto_times_fused_backward(env, GpuPath::ring) && !deterministic;
    const std::string all = ::testing::PrintToString(got.notes);
    EXPECT_EQ(has_note(got, "kernel=auto: the ring's sm_90a backward in two passes "), timed)
        << what << " P=" << p << ": " << all;
    // The forward's forms too (plain, overlap, Q in registers), on the slowest rank.
    const bool forms_timed = !deterministic && testing::auto_times_forward_forms();
    EXPECT_EQ(has_note(got, "kernel=auto: the ring's sm_90a forward plain "), forms_timed)
        << what << " P=" << p << ": " << all;
    // Only what a GPU has passed is timed; each form left out has a note.
    const bool backward_would = testing::auto_would_time_backward(env) && !deterministic;
    EXPECT_EQ(has_note(got, "leaves out the sm_90a backward's fused kernel:"),
              backward_would && !verified(GpuForm::hopper_backward_fused))
        << what << " P=" << p << ": " << all;
    EXPECT_EQ(has_note(got, "leaves out the sm_90a backward's wide fused kernel:"),
              backward_would && !verified(GpuForm::hopper_backward_fused_wide))
        << what << " P=" << p << ": " << all;
    EXPECT_EQ(has_note(got, "leaves out the sm_90a forward with Q in registers:"),
              forms_timed && !verified(GpuForm::hopper_forward_qregs))
        << what << " P=" << p << ": " << all;
    EXPECT_EQ(has_note(got, ", Q in registers "),
              forms_timed && verified(GpuForm::hopper_forward_qregs))
        << what << " P=" << p << ": " << all;
    if (timed) {
      EXPECT_TRUE(has_note(got, "(median of 5, slowest rank); using the ")) << all;
      EXPECT_EQ(has_note(got, " ms, fused wide "), verified(GpuForm::hopper_backward_fused_wide))
          << all;
      EXPECT_EQ(got.kernel_backward == "hopper-fused", has_note(got, "using the fused kernel"))
          << all;
      EXPECT_EQ(got.kernel_backward == "hopper-fused-wide",
                has_note(got, "using the wide fused kernel"))
          << all;
    } else if ((env != "fused" && env != "fused_wide") || deterministic) {
      EXPECT_EQ(got.kernel_backward, "hopper") << what << " P=" << p;
    }
  };
  for (const bool deterministic : {false, true})
    for (int p : {1, 2})
      run(std::string("auto fused timing") + (deterministic ? " det" : ""), p, deterministic);
#if RINGATTN_CUDA_EMULATION
  // The ctest entry says the forms are verified (RINGATTN_TEST_VERIFIED_FORMS), so that the
  // timing above runs; without that, none of them is, as on a GPU today.
  if (std::getenv("RINGATTN_TEST_VERIFIED_FORMS")) {
    const EnvScope unverified("RINGATTN_TEST_VERIFIED_FORMS", nullptr);
    run("auto, fused forms unverified", 2, false);
  }
#endif
}

#endif

#if RINGATTN_CUDA_EMULATION
// What cuDNN refuses on the ring falls back step by step: with the stand-in refusing every
// banded view (RINGATTN_EMU_CUDNN_REFUSE=band, as a cuDNN that cannot build them), a causal
// ring's diagonal steps run on ringattn's kernels and the rest on cuDNN, the results match
// float64 at P = 1..4, and a note names the steps and the reason. The whole job never fails.
TEST(CudaRing, CudnnRefusalsFallBackStepByStepWithANote) {
  const testing::CudnnStandinScope standin;
  const EnvScope refuse("RINGATTN_EMU_CUDNN_REFUSE", "band");
  AttentionConfig cfg;
  for (const auto& c : testing::random_ring_cases())
    if (std::string(c.name) == "dense_D64") cfg = testing::config_of(c, true);
  const RingInputs in = testing::random_inputs(cfg);
  for (int p = 1; p <= 4; ++p) {
    if (cfg.shape.seq_len % p != 0) continue;
    const Full got = expect_matches_reference("cudnn, bands refused", cfg, in, p,
                                              DeviceDType::bf16, {}, KernelChoice::cudnn, false,
                                              false);
    const std::string all = ::testing::PrintToString(got.notes);
    EXPECT_TRUE(has_note(got, "stand-in refuses views with a diagonal band")) << all;
    if (p == 1) {  // the one step is a diagonal: the whole ring is ours, with the reason
      EXPECT_EQ(got.kernel, "hopper") << all;
      EXPECT_TRUE(has_note(got, "kernel=cudnn: cuDNN cannot run this ring's steps")) << all;
    } else {
      EXPECT_EQ(got.kernel, "cudnn") << all;
      EXPECT_EQ(got.kernel_backward, "cudnn") << all;
      EXPECT_TRUE(has_note(got, "kernel=cudnn: cuDNN cannot run ring step 0 of ")) << all;
      EXPECT_TRUE(has_note(got, "those run on the sm_90a kernels")) << all;
    }
  }
}

// A refused backward alone (cuDNN 9.19 will not build the backward of a one-token document's
// 1 x 1 view; the stand-in refuses it with RINGATTN_EMU_CUDNN_REFUSE=one_token_backward)
// keeps that step's forward on cuDNN and runs its backward on ringattn's kernels, the other
// steps' backward on cuDNN; a note names the steps; float64 at P = 1..4.
TEST(CudaRing, CudnnRefusedBackwardKeepsTheStepsForwardOnCudnn) {
  const testing::CudnnStandinScope standin;
  const EnvScope refuse("RINGATTN_EMU_CUDNN_REFUSE", "one_token_backward");
  AttentionConfig cfg;
  cfg.shape = {1, 96, 4, 64};
  cfg.causal = true;
  cfg.cu_seqlens = {0, 1, 30, 31, 70, 96};
  const RingInputs in = testing::random_inputs(cfg);
  for (int p = 1; p <= 4; ++p) {
    const Full got = expect_matches_reference("cudnn, one-token backward refused", cfg, in, p,
                                              DeviceDType::bf16, {}, KernelChoice::cudnn, false,
                                              false);
    const std::string all = ::testing::PrintToString(got.notes);
    EXPECT_EQ(got.kernel, "cudnn") << all;
    EXPECT_EQ(got.kernel_backward, p == 1 ? "hopper" : "cudnn") << all;
    EXPECT_TRUE(has_note(got, "kernel=cudnn: cuDNN cannot run the backward of ring step 0 of"))
        << all;
    EXPECT_TRUE(has_note(got, "s_q = s_kv = 1")) << all;
  }
}
#endif

// docs/COMMUNICATION.md's per-rank bound: per-step partials (the path a library kernel that
// cannot merge in place takes) cost one more shard's output and lse in fp32, B·n·H·(D + 1)·4
// bytes, on top of the merged path's workspace, and nothing else.
TEST(CudaRing, PartialsCostOneShardOfOutputAndLse) {
  if (const std::string why = skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  const AttentionConfig cfg = testing::config_of(testing::random_ring_cases()[2], true);
  const RingInputs in = testing::random_inputs(cfg);
  const bool shared = ranks_share_a_device(2);
  ring::RingOptions partials;
  partials.step_results = ring::RingOptions::StepResults::partials;
  const Full merged = run_gpu_ring(cfg, in, 2, DeviceDType::bf16, {}, shared);
  const Full split = run_gpu_ring(cfg, in, 2, DeviceDType::bf16, partials, shared);
  const Shape4& s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.seq_len / 2);
  const std::size_t extra = static_cast<std::size_t>(s.batch * s.heads) * n *
                            static_cast<std::size_t>(s.head_dim + 1) * sizeof(float);
  for (std::size_t r = 0; r < 2; ++r)
    EXPECT_EQ(split.workspace[r], merged.workspace[r] + extra) << r;
}

// dK/dV partials come back in step order: two runs give the same bits.
TEST(CudaRing, BackwardIsBitwiseReproducible) {
  if (const std::string why = skip_reason(4); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  AttentionConfig cfg = testing::config_of(testing::random_ring_cases()[2], true);
  const RingInputs in = testing::random_inputs(cfg);
  const bool shared = ranks_share_a_device(4);
  const Full a = run_gpu_ring(cfg, in, 4, DeviceDType::bf16, {}, shared);
  const Full b = run_gpu_ring(cfg, in, 4, DeviceDType::bf16, {}, shared);
  for (auto [x, y, name] : {std::tuple{&a.out, &b.out, "out"},
                            {&a.dq, &b.dq, "dq"},
                            {&a.dk, &b.dk, "dk"},
                            {&a.dv, &b.dv, "dv"}})
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0) << name;
}

#if RINGATTN_CUDA_EMULATION
using testing::same_bits;

// Streams that start each task after a random delay (several seeds) give the same bits: the
// compute and communication streams are ordered by events, not by luck. And the test has
// teeth: with the exchanges posted without the compute stream's "packed, and the receive
// buffer is free" event, some seed gives a different answer.
TEST(CudaRingEmulated, RandomStreamDelaysChangeNoBitAndTheBufferOrderingIsWhatMakesItSo) {
  AttentionConfig cfg = testing::config_of(testing::random_ring_cases()[0], true);
  cfg.shape = {1, 192, 2, 64};
  const RingInputs in = testing::random_inputs(cfg);
  emu::runtime::set_stream_delays(false);
  const Full base = run_gpu_ring(cfg, in, 3, DeviceDType::bf16);
  for (std::uint64_t seed : {1, 2, 3}) {
    emu::runtime::set_stream_delays(true, seed);
    EXPECT_TRUE(same_bits(base, run_gpu_ring(cfg, in, 3, DeviceDType::bf16))) << "seed " << seed;
  }
  ring::RingOptions unordered;
  unordered.skip_buffer_ordering_for_tests = true;
  int differing = 0;
  for (std::uint64_t seed : {1, 2, 3}) {
    emu::runtime::set_stream_delays(true, seed);
    differing += same_bits(base, run_gpu_ring(cfg, in, 3, DeviceDType::bf16, unordered)) ? 0 : 1;
  }
  emu::runtime::set_stream_delays(false);
  std::printf("  without the ordering events, %d of 3 delay seeds changed the result\n", differing);
  EXPECT_GT(differing, 0) << "the ordering the engine relies on was not exercised";
}
#endif

}  // namespace
}  // namespace ringattn
