// The library API on GPUs (label gpu; gpu-emu under the emulated GPU): make_engine with
// Device::cuda on one rank and on virtual ranks sharing a GPU, host calls (staged through
// the device) against the float64 reference of the inputs rounded to the device dtype, the
// TensorRef path on device buffers giving the host path's bits, and the transport refused
// by name. Without a usable device every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_skip.hpp"
#include "job/comm_access.hpp"
#include "random.hpp"
#include "ring/inproc_communicator.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/ringattn.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn {
namespace {

constexpr double kHalfTolerance = 1e-2;
#if RINGATTN_CUDA_EMULATION
constexpr bool kEmulatedGpu = true;
#else
constexpr bool kEmulatedGpu = false;
#endif

JobSpec causal_job() {
  JobSpec spec;
  spec.config.shape = {1, 128, 2, 64};
  spec.config.causal = true;
  spec.device = Device::cuda;
  spec.dtype = DeviceDType::bf16;
  spec.kernel = KernelChoice::native;
  spec.timeout_s = 120;
  return spec;
}

std::vector<float> take(const std::vector<float>& full, const std::vector<int64_t>& rows,
                        int64_t seq_len, int64_t inner) {
  std::vector<float> local;
  for (const int64_t p : rows)
    local.insert(local.end(), full.begin() + p * inner, full.begin() + (p + 1) * inner);
  (void)seq_len;
  return local;
}

TEST(EngineCuda, OneRankHostCallsMatchTheFloat64Reference) {
  REQUIRE_GPU();
  const JobSpec spec = causal_job();
  const auto n = static_cast<std::size_t>(spec.config.shape.numel());
  auto q = testing::random_normal(n, 1), k = testing::random_normal(n, 2),
       v = testing::random_normal(n, 3), dout = testing::random_normal(n, 4);
  for (auto* t : {&q, &k, &v, &dout})
    round_to_device_dtype(t->data(), t->size(), DeviceDType::bf16);
  Comm comm = Comm::single();
  Engine e = make_engine(spec, comm);
  EXPECT_EQ(e.device(), Device::cuda);
  EXPECT_EQ(e.stats().engine, "CudaPlan");
  std::vector<float> out(n), lse(256), dq(n), dk(n), dv(n);
  e.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
  e.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
             dk.data(), dv.data());
  const ReferenceForward ref = reference_forward(spec.config, q.data(), k.data(), v.data());
  const ReferenceGradients g =
      reference_backward(spec.config, q.data(), k.data(), v.data(), dout.data());
  EXPECT_LE(relative_error(out.data(), ref.out.data(), n), kHalfTolerance);
  EXPECT_LE(relative_error(dq.data(), g.dq.data(), n), kHalfTolerance);
  EXPECT_LE(relative_error(dk.data(), g.dk.data(), n), kHalfTolerance);
  EXPECT_LE(relative_error(dv.data(), g.dv.data(), n), kHalfTolerance);

  // The same call on device tensors the caller owns gives the host path's bits.
  DeviceBuffer dq_(n * 2, "q", 0), dk_(n * 2, "k", 0), dv_(n * 2, "v", 0),
      dout_(n * sizeof(float), "out", 0), dlse(256 * sizeof(float), "lse", 0);
  dq_.upload(q.data(), n, DeviceDType::bf16);
  dk_.upload(k.data(), n, DeviceDType::bf16);
  dv_.upload(v.data(), n, DeviceDType::bf16);
  const auto ref_of = [](const DeviceBuffer& b, DeviceDType t) {
    return TensorRef{b.data(), t, Memory::device, nullptr};
  };
  e.forward(ref_of(dq_, DeviceDType::bf16), ref_of(dk_, DeviceDType::bf16),
            ref_of(dv_, DeviceDType::bf16), ref_of(dout_, DeviceDType::fp32),
            ref_of(dlse, DeviceDType::fp32));
  e.synchronize();
  std::vector<float> out2(n);
  dout_.download(out2.data(), n);
  EXPECT_EQ(out2, out);
  // A device tensor of the wrong dtype is refused naming it.
  try {
    e.forward(ref_of(dq_, DeviceDType::fp16), ref_of(dk_, DeviceDType::bf16),
              ref_of(dv_, DeviceDType::bf16), ref_of(dout_, DeviceDType::fp32),
              ref_of(dlse, DeviceDType::fp32));
    ADD_FAILURE() << "an fp16 q was accepted by a bf16 engine";
  } catch (const InputError& err) {
    EXPECT_EQ(err.subject(), "q");
  }
}

TEST(EngineCuda, VirtualRanksSharingAGpuMatchTheFloat64Reference) {
  REQUIRE_GPU();
  const JobSpec spec = causal_job();
  const Shape4& s = spec.config.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  auto q = testing::random_normal(n, 5), k = testing::random_normal(n, 6),
       v = testing::random_normal(n, 7);
  for (auto* t : {&q, &k, &v}) round_to_device_dtype(t->data(), t->size(), DeviceDType::bf16);
  const ReferenceForward ref = reference_forward(spec.config, q.data(), k.data(), v.data());
  const std::vector<float> want(ref.out.begin(), ref.out.end());
  std::atomic<int> ok{0};
  const int ranks = 2;
  ASSERT_EQ(
      ring::run_virtual_ranks(
          ranks,
          [&](ring::Communicator& rc) {
            Comm comm = CommAccess::borrow(rc);
            Engine e = make_engine(spec, comm);
            const auto rows = e.local_rows();
            const int64_t inner = s.heads * s.head_dim;
            const auto lq = take(q, rows, s.seq_len, inner), lk = take(k, rows, s.seq_len, inner),
                       lv = take(v, rows, s.seq_len, inner),
                       lwant = take(want, rows, s.seq_len, inner);
            std::vector<float> out(lq.size()), lse(static_cast<std::size_t>(s.heads) * rows.size());
            e.forward(lq.data(), lk.data(), lv.data(), out.data(), lse.data());
            const EngineStats st = e.stats();
            if (st.engine == "CudaRingPlan" && st.bytes_sent == st.bytes_sent_min &&
                relative_error(out.data(), lwant.data(), out.size()) <= kHalfTolerance)
              ++ok;
            return 0;
          }),
      0);
  EXPECT_EQ(ok.load(), ranks);
}

// Ulysses x ring on four virtual ranks sharing the GPU: U = 2 (a ring of two groups; the
// K/V heads split) and U = 4 (one group, the single-GPU plan inside; each K/V head goes to
// two ranks and their dK/dV are summed), batch 2 so that the all-to-all's 2-D copies walk
// batches: forward and gradients against float64, bytes against their minimum. Again with
// values of their own head dim and soft-capped logits (Dv = 32 beside D = 64, c = 5), on
// the native kernels and, asked for, on cuDNN's ring steps.
TEST(EngineCuda, UlyssesOnVirtualRanksMatchesTheFloat64Reference) {
  REQUIRE_GPU();
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
  for (const bool mla_cap : {false, true}) {
    JobSpec spec = causal_job();
    spec.config.shape = {2, 128, 4, 64};
    spec.config.kv_heads = 2;
    if (mla_cap) {  // values of 32 columns beside q and k of 64, logits capped at 5
      spec.config.head_dim_v = 32;
      spec.config.softcap = 5;
      spec.config.scale = 5 / std::sqrt(64.0);
    }
    SCOPED_TRACE(mla_cap ? "head_dim_v 32, softcap 5" : "one head dim");
    const AttentionConfig& cfg = spec.config;
    const Shape4& s = cfg.shape;
    auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 11),
         k = testing::random_normal(static_cast<std::size_t>(cfg.kv_shape().numel()), 12),
         v = testing::random_normal(static_cast<std::size_t>(cfg.v_shape().numel()), 13),
         dout = testing::random_normal(static_cast<std::size_t>(cfg.out_shape().numel()), 14);
    for (auto* t : {&q, &k, &v, &dout})
      round_to_device_dtype(t->data(), t->size(), DeviceDType::bf16);
    const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
    const ReferenceGradients g = reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
    const std::vector<float> want(ref.out.begin(), ref.out.end()),
        want_dq(g.dq.begin(), g.dq.end()), want_dk(g.dk.begin(), g.dk.end()),
        want_dv(g.dv.begin(), g.dv.end());
    // Rows of batch-major [B, N, inner] tensors.
    auto rows_of = [&](const std::vector<float>& full, const std::vector<int64_t>& rows,
                       int64_t inner) {
      std::vector<float> local;
      for (int64_t b = 0; b < s.batch; ++b)
        for (const int64_t p : rows) {
          const auto at = full.begin() + (b * s.seq_len + p) * inner;
          local.insert(local.end(), at, at + inner);
        }
      return local;
    };
    // U = 4 is one group: each rank's slice is a single-GPU plan, which may take cuDNN; with
    // U = 2 each slice's ring of two takes cuDNN per step (on the emulated GPU, cuDNN's
    // stand-in: cudnn/graphs_emulated.cpp), with MLA and the cap too.
    std::vector<std::pair<int, KernelChoice>> runs = {{2, KernelChoice::native},
                                                      {4, KernelChoice::native}};
#if RINGATTN_TEST_HAVE_CUDNN
    runs.emplace_back(4, KernelChoice::cudnn);
#endif
#if RINGATTN_TEST_HAVE_CUDNN || RINGATTN_CUDA_EMULATION
    runs.emplace_back(2, KernelChoice::cudnn);
#endif
    if (mla_cap) runs.emplace_back(2, KernelChoice::automatic);
    for (const auto& [u, kernel] : runs) {
      spec.ulysses = u;
      spec.kernel = kernel;
      std::atomic<int> ok{0};
      std::mutex m;
      std::vector<std::string> failures;
      ASSERT_EQ(
          ring::run_virtual_ranks(
              4,
              [&](ring::Communicator& rc) {
                Comm comm = CommAccess::borrow(rc);
                Engine e = make_engine(spec, comm);
                const auto rows = e.local_rows();
                const int64_t dv_cols = cfg.effective_head_dim_v();
                const int64_t inner = s.heads * s.head_dim, inner_o = s.heads * dv_cols,
                              inner_kv = cfg.effective_kv_heads() * s.head_dim,
                              inner_v = cfg.effective_kv_heads() * dv_cols;
                const auto lq = rows_of(q, rows, inner), lk = rows_of(k, rows, inner_kv),
                           lv = rows_of(v, rows, inner_v), ld = rows_of(dout, rows, inner_o);
                std::vector<float> out(ld.size()), dq(lq.size()), dk(lk.size()), dv(lv.size()),
                    lse(static_cast<std::size_t>(s.batch * s.heads) * rows.size());
                e.forward(lq.data(), lk.data(), lv.data(), out.data(), lse.data());
                e.backward(lq.data(), lk.data(), lv.data(), out.data(), lse.data(), ld.data(),
                           dq.data(), dk.data(), dv.data());
                const EngineStats st = e.stats();
                const double errs[] = {
                    relative_error(out.data(), rows_of(want, rows, inner_o).data(), out.size()),
                    relative_error(dq.data(), rows_of(want_dq, rows, inner).data(), dq.size()),
                    relative_error(dk.data(), rows_of(want_dk, rows, inner_kv).data(), dk.size()),
                    relative_error(dv.data(), rows_of(want_dv, rows, inner_v).data(), dv.size())};
                bool good = st.ulysses == u && st.bytes_sent == st.bytes_sent_min &&
                            st.bytes_sent_a2a == st.bytes_sent_a2a_min;
                // With MLA and the cap, cuDNN's graphs run only where asked (auto leaves them
                // out until a GPU has passed them; a GPU's cuDNN may refuse one, and the
                // native kernels then run, saying why).
                const bool cudnn_expected =
                    kernel == KernelChoice::cudnn && (!mla_cap || kEmulatedGpu);
                if (cudnn_expected)
                  good = good && st.kernel == "cudnn" && st.kernel_backward == "cudnn";
                if (mla_cap && kernel != KernelChoice::cudnn)
                  good = good && st.kernel == "native" && st.kernel_backward == "native";
                for (const double err : errs) good = good && err <= kHalfTolerance;
                if (good) {
                  ++ok;
                } else {
                  std::lock_guard lock(m);
                  failures.push_back("U " + std::to_string(u) + " rank " +
                                     std::to_string(comm.rank()) + ": " + st.engine +
                                     " (kernel " + st.kernel + ", backward " +
                                     st.kernel_backward + "), bytes " +
                                     std::to_string(st.bytes_sent) + "/" +
                                     std::to_string(st.bytes_sent_min) + ", errors " +
                                     std::to_string(errs[0]) + " " + std::to_string(errs[1]) +
                                     " " + std::to_string(errs[2]) + " " +
                                     std::to_string(errs[3]));
                }
                return 0;
              }),
          0);
      for (const std::string& f : failures) ADD_FAILURE() << f;
      EXPECT_EQ(ok.load(), 4) << "U " << u << ", kernel " << to_string(kernel);
    }
    if (mla_cap) {  // and the cap is what is checked
      AttentionConfig uncapped = cfg;
      uncapped.softcap = 0;
      const ReferenceForward u = reference_forward(uncapped, q.data(), k.data(), v.data());
      const std::vector<float> u32(u.out.begin(), u.out.end());
      EXPECT_GT(relative_error(u32.data(), want.data(), u32.size()), 10 * kHalfTolerance);
    }
  }
}

// Attention sinks on the GPU engines through device tensors (the Python package's path): one
// GPU on the native, sm_90a and cuDNN kernels, the ring of two ranks sharing the GPU (native
// and cuDNN steps), Ulysses x ring and block-sparse, each rank's out, lse, gradients and the
// sinks' gradient (each rank's part, summed over the ranks) against float64.
TEST(EngineCuda, SinksOnEveryGpuPathMatchTheFloat64Reference) {
  REQUIRE_GPU();
  JobSpec spec = causal_job();
  spec.config.shape = {1, 128, 4, 64};
  spec.config.kv_heads = 2;
  spec.sinks = true;
  const Shape4& s = spec.config.shape;
  const Shape4 skv = spec.config.kv_shape();
  auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 31),
       k = testing::random_normal(static_cast<std::size_t>(skv.numel()), 32),
       v = testing::random_normal(static_cast<std::size_t>(skv.numel()), 33),
       dout = testing::random_normal(static_cast<std::size_t>(s.numel()), 34);
  for (auto* t : {&q, &k, &v, &dout})
    round_to_device_dtype(t->data(), t->size(), DeviceDType::bf16);
  const std::vector<float> sinks = {1.0f, -0.5f, -std::numeric_limits<float>::infinity(), 2.0f};
  struct Run {
    const char* name;
    int ranks, ulysses;
    KernelChoice kernel;
    bool block_sparse;
  };
  std::vector<Run> runs = {{"one GPU native", 1, 1, KernelChoice::native, false},
                           {"ring P=2 native", 2, 1, KernelChoice::native, false},
                           {"Ulysses U=2 P=2", 2, 2, KernelChoice::native, false},
                           {"block-sparse P=2", 2, 1, KernelChoice::native, true}};
  if (probe_cuda_device().cc_major == 9)  // the emulated GPUs are sm_90s too
    runs.push_back({"one GPU hopper", 1, 1, KernelChoice::hopper, false});
#if RINGATTN_TEST_HAVE_CUDNN
  runs.push_back({"one GPU cudnn", 1, 1, KernelChoice::cudnn, false});
#endif
#if RINGATTN_TEST_HAVE_CUDNN || RINGATTN_CUDA_EMULATION
  // On the emulated GPU, the ring's cuDNN steps run on cuDNN's stand-in.
  runs.push_back({"ring P=2 cudnn", 2, 1, KernelChoice::cudnn, false});
#endif
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
  for (const Run& run : runs) {
    JobSpec js = spec;
    js.device_index = 0;              // every rank on GPU 0, where the test's buffers are,
    js.transport = Transport::local;  // exchanging by device copies
    js.ulysses = run.ulysses;
    js.kernel = run.kernel;
    if (run.block_sparse) {
      js.config.attention = AttentionKind::block_sparse;
      js.config.block_size = 32;
      js.block_sparse.pattern = "local:window=64+global:blocks=1";
    }
    std::mutex m;
    std::vector<std::string> failures;
    std::vector<std::vector<int64_t>> rows(static_cast<std::size_t>(run.ranks));
    std::vector<std::vector<float>> outs(rows.size()), lses(rows.size()), dqs(rows.size()),
        dks(rows.size()), dvs(rows.size()), dss(rows.size());
    ASSERT_EQ(ring::run_virtual_ranks(
                  run.ranks,
                  [&](ring::Communicator& rc) {
                    Comm comm = CommAccess::borrow(rc);
                    Engine e = make_engine(js, comm);
                    const auto r = static_cast<std::size_t>(comm.rank());
                    rows[r] = e.local_rows();
                    const int64_t inner = s.heads * s.head_dim, inner_kv = skv.heads * s.head_dim;
                    const auto lq = take(q, rows[r], s.seq_len, inner),
                               lk = take(k, rows[r], s.seq_len, inner_kv),
                               lv = take(v, rows[r], s.seq_len, inner_kv),
                               ld = take(dout, rows[r], s.seq_len, inner);
                    const int dev = 0;
                    const auto bf = DeviceDType::bf16, f32 = DeviceDType::fp32;
                    const std::size_t nl = lq.size(), nkv = lk.size(),
                                      nlse = static_cast<std::size_t>(s.heads) * rows[r].size();
                    DeviceBuffer bq(nl * 2, "q", dev), bk(nkv * 2, "k", dev), bv(nkv * 2, "v", dev),
                        bd(nl * 2, "dout", dev), bo(nl * 4, "out", dev), bl(nlse * 4, "lse", dev),
                        bdq(nl * 4, "dq", dev), bdk(nkv * 4, "dk", dev), bdv(nkv * 4, "dv", dev),
                        bs(sinks.size() * 4, "sinks", dev), bds(sinks.size() * 4, "dsinks", dev);
                    bq.upload(lq.data(), nl, bf);
                    bk.upload(lk.data(), nkv, bf);
                    bv.upload(lv.data(), nkv, bf);
                    bd.upload(ld.data(), nl, bf);
                    bs.upload(sinks.data(), sinks.size(), f32);
                    const auto ref = [](const DeviceBuffer& b, DeviceDType t) {
                      return TensorRef{b.data(), t, Memory::device, nullptr};
                    };
                    e.forward(ref(bq, bf), ref(bk, bf), ref(bv, bf), ref(bo, f32), ref(bl, f32),
                              ref(bs, f32));
                    e.backward(ref(bq, bf), ref(bk, bf), ref(bv, bf), ref(bo, f32), ref(bl, f32),
                               ref(bd, bf), ref(bdq, f32), ref(bdk, f32), ref(bdv, f32),
                               ref(bs, f32), ref(bds, f32));
                    e.synchronize();
                    outs[r].resize(nl), lses[r].resize(nlse), dqs[r].resize(nl);
                    dks[r].resize(nkv), dvs[r].resize(nkv), dss[r].resize(sinks.size());
                    bo.download(outs[r].data(), nl);
                    bl.download(lses[r].data(), nlse);
                    bdq.download(dqs[r].data(), nl);
                    bdk.download(dks[r].data(), nkv);
                    bdv.download(dvs[r].data(), nkv);
                    bds.download(dss[r].data(), sinks.size());
                    const EngineStats st = e.stats();
                    if (run.kernel != KernelChoice::native && st.kernel != to_string(run.kernel)) {
                      std::lock_guard lock(m);
                      failures.push_back(std::string(run.name) + ": ran " + st.kernel);
                    }
                    return 0;
                  }),
              0);
    for (const std::string& f : failures) ADD_FAILURE() << f;
    ReferenceForward want;
    ReferenceGradients g;
    if (run.block_sparse) {
      BlockReferenceProblem pb = block_problem_of(js.config);
      // local:window=64 (blocks qb-1..qb+1) + global:blocks=1 (block 0 sees all, all see it)
      pb.key_blocks = [&](int64_t, int64_t qb) {
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < 4; ++j)
          if (qb == 0 || j == 0 || (j >= qb - 1 && j <= qb + 1)) keys.push_back(j);
        return keys;
      };
      pb.sinks = sinks;
      want = reference_forward_blocks(pb, q.data(), k.data(), v.data());
      g = reference_backward_blocks(pb, q.data(), k.data(), v.data(), dout.data());
    } else {
      want = reference_forward(js.config, q.data(), k.data(), v.data(), sinks.data());
      g = reference_backward(js.config, q.data(), k.data(), v.data(), dout.data(), sinks.data());
    }
    const std::vector<float> wout(want.out.begin(), want.out.end()), wdq(g.dq.begin(), g.dq.end()),
        wdk(g.dk.begin(), g.dk.end()), wdv(g.dv.begin(), g.dv.end());
    const int64_t inner = s.heads * s.head_dim, inner_kv = skv.heads * s.head_dim;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> wlse;
      for (int64_t h = 0; h < s.heads; ++h)
        for (const int64_t p : rows[r])
          wlse.push_back(static_cast<float>(want.lse[static_cast<std::size_t>(h * s.seq_len + p)]));
      const std::string at = std::string(run.name) + ", rank " + std::to_string(r);
      EXPECT_LE(relative_error(outs[r].data(), take(wout, rows[r], s.seq_len, inner).data(),
                               outs[r].size()),
                kHalfTolerance)
          << at;
      EXPECT_LE(relative_error(lses[r].data(), wlse.data(), wlse.size()), 1e-4) << at;
      EXPECT_LE(
          relative_error(dqs[r].data(), take(wdq, rows[r], s.seq_len, inner).data(), dqs[r].size()),
          kHalfTolerance)
          << at;
      EXPECT_LE(relative_error(dks[r].data(), take(wdk, rows[r], s.seq_len, inner_kv).data(),
                               dks[r].size()),
                kHalfTolerance)
          << at;
      EXPECT_LE(relative_error(dvs[r].data(), take(wdv, rows[r], s.seq_len, inner_kv).data(),
                               dvs[r].size()),
                kHalfTolerance)
          << at;
      EXPECT_EQ(dss[r][2], 0.0f) << at << ": no sink (-inf), no gradient";
    }
    std::vector<float> job(sinks.size(), 0.0f);
    for (const auto& part : dss)
      for (std::size_t h = 0; h < sinks.size(); ++h) job[h] += part[h];
    EXPECT_LE(relative_error(job.data(), g.dsinks.data(), sinks.size()), kHalfTolerance)
        << run.name << ": dsinks";
  }
}

TEST(EngineCuda, MpiTransportIsRefusedNamingComm) {
  REQUIRE_GPU();
  JobSpec spec = causal_job();
  spec.transport = Transport::mpi;
  std::atomic<int> refused{0};
  ASSERT_EQ(ring::run_virtual_ranks(2,
                                    [&](ring::Communicator& rc) {
                                      Comm comm = CommAccess::borrow(rc);
                                      try {
                                        (void)make_engine(spec, comm);
                                      } catch (const InputError& e) {
                                        if (e.subject() == "transport") ++refused;
                                      }
                                      return 0;
                                    }),
            0);
  EXPECT_EQ(refused.load(), 2);
}

// Values of their own head dim (MLA's 192/128 and others) and soft-capped logits on one GPU:
// the native kernels (tensor-core in bf16/fp16, the fp32 kernels in fp32), forward and every
// gradient against the float64 reference of the inputs rounded to the dtype, with the cap
// large enough to change the answer; auto runs them (the sm_90a kernels do not compute these,
// and auto leaves cuDNN's such graphs out until a GPU has passed them), saying so. Where
// cuDNN is built (a GPU's build; the emulated GPU's CudaPlan has none, and
// CudaKernels.CudnnValueHeadDimAndSoftcap* runs CudnnSdpa on its stand-in), bf16 and fp16
// also run with --kernel cudnn: cuDNN's graphs (V and O of their own width, the soft-cap as
// its score modifier with the band inside it), with a note that they are unverified on
// hardware, or the native kernels and cuDNN's reason where it refuses a graph.
TEST(EngineCuda, ValueHeadDimAndSoftcapOnOneGpuMatchFloat64) {
  REQUIRE_GPU();
  struct Case {
    const char* name;
    Shape4 shape;
    int64_t dv;
    double cap;
    DeviceDType dtype;
    void (*more)(AttentionConfig&);
  };
  const Case cases[] = {
      {"mla_192_128_causal", {1, 128, 2, 192}, 128, 0, DeviceDType::bf16,
       [](AttentionConfig& c) { c.causal = true; }},
      {"mla_64_32_mqa_window_fp32", {2, 96, 2, 64}, 32, 0, DeviceDType::fp32,
       [](AttentionConfig& c) {
         c.kv_heads = 1;
         c.window_left = 40;
         c.window_right = 8;
       }},
      {"cap30_causal", {1, 128, 2, 64}, 64, 30, DeviceDType::bf16,
       [](AttentionConfig& c) { c.causal = true; }},
      {"cap5_mla_40_24_dilated", {1, 128, 3, 40}, 24, 5, DeviceDType::fp16,
       [](AttentionConfig& c) {
         c.attention = AttentionKind::dilated;
         c.segments = {64, 128};
         c.dilations = {1, 2};
       }},
      {"cap1_mla_64_128_packed_fp32", {1, 128, 2, 64}, 128, 1, DeviceDType::fp32,
       [](AttentionConfig& c) {
         c.causal = true;
         c.cu_seqlens = {0, 50, 128};
       }},
  };
  std::vector<std::pair<const Case*, KernelChoice>> runs;
  for (const Case& c : cases) {
    runs.emplace_back(&c, KernelChoice::automatic);
    // The cap alone: the sm_90a kernels compute it where --kernel hopper asks.
    if (c.cap > 0 && c.dv == c.shape.head_dim) runs.emplace_back(&c, KernelChoice::hopper);
#if RINGATTN_TEST_HAVE_CUDNN
    if (c.dtype != DeviceDType::fp32) runs.emplace_back(&c, KernelChoice::cudnn);
#endif
  }
  for (const auto& [cp, kernel] : runs) {
    const Case& c = *cp;
    SCOPED_TRACE(std::string(c.name) + ", kernel " + to_string(kernel));
    JobSpec spec;
    spec.kernel = kernel;
    spec.config.shape = c.shape;
    spec.config.head_dim_v = c.dv;
    spec.config.softcap = c.cap;
    if (c.cap > 0) spec.config.scale = c.cap / std::sqrt(static_cast<double>(c.shape.head_dim));
    c.more(spec.config);
    spec.device = Device::cuda;
    spec.dtype = c.dtype;
    spec.timeout_s = 120;
    const AttentionConfig& cfg = spec.config;
    auto q = testing::random_normal(static_cast<std::size_t>(cfg.shape.numel()), 1);
    auto k = testing::random_normal(static_cast<std::size_t>(cfg.kv_shape().numel()), 2);
    auto v = testing::random_normal(static_cast<std::size_t>(cfg.v_shape().numel()), 3);
    auto dout = testing::random_normal(static_cast<std::size_t>(cfg.out_shape().numel()), 4);
    for (auto* t : {&q, &k, &v, &dout}) round_to_device_dtype(t->data(), t->size(), c.dtype);
    Comm comm = Comm::single();
    Engine e = make_engine(spec, comm);
    ASSERT_EQ(e.device(), Device::cuda);
    const auto rows = static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads);
    std::vector<float> out(dout.size()), lse(rows * static_cast<std::size_t>(cfg.shape.seq_len));
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    e.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
    e.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
               dk.data(), dv.data());
    const EngineStats st = e.stats();
    const auto noted = [&](const std::string& text) {
      return std::any_of(st.notes.begin(), st.notes.end(),
                         [&](const std::string& n) { return n.find(text) != std::string::npos; });
    };
    const std::string all = ::testing::PrintToString(st.notes);
    if (kernel == KernelChoice::hopper) {
#if RINGATTN_CUDA_EMULATION  // an sm_90 (a GPU may not be one: native, saying why)
      EXPECT_EQ(st.kernel, "hopper") << all;
      EXPECT_EQ(st.kernel_backward, "hopper") << all;
#endif
      if (st.kernel == "hopper") {
        EXPECT_TRUE(noted("kernel=hopper runs the sm_90a kernels' soft-cap, unverified on "
                          "hardware"))
            << all;
      }
      // The native kernels' caveat only where they ran a pass.
      if (st.kernel == "hopper" && st.kernel_backward.starts_with("hopper")) {
        EXPECT_FALSE(noted("the native kernels compute")) << all;
      }
    } else if (kernel == KernelChoice::cudnn) {
      if (st.kernel == "cudnn") {  // a real cuDNN may refuse a graph: native runs, saying why
        EXPECT_TRUE(noted("kernel=cudnn runs cuDNN's graphs with values of their own head dim or "
                          "a soft-cap score modifier, unverified on hardware"))
            << all;
      } else {
        EXPECT_TRUE(noted("kernel=cudnn: cuDNN cannot run this configuration")) << all;
      }
    } else {
      EXPECT_EQ(st.kernel, "native") << all;
      EXPECT_TRUE(noted("no GPU has run yet")) << "no note that these kernels are unverified on "
                                                  "hardware: "
                                               << all;
#if RINGATTN_CUDA_EMULATION  // an sm_90: where the sm_90a kernels could run, they say why not
      const int64_t d = c.shape.head_dim;
      if (c.dtype != DeviceDType::fp32 && (d == 64 || d == 128 || d == 256)) {
        EXPECT_TRUE(noted(c.dv != d ? "they do not compute values of their own"
                                    : "kernel=auto: the native kernels stand in for the sm_90a "
                                      "ones (kernel=auto leaves out the sm_90a kernels' soft-cap"))
            << all;
      }
#endif
#if RINGATTN_TEST_HAVE_CUDNN
      if (c.dtype != DeviceDType::fp32) {
        EXPECT_TRUE(noted("kernel=auto leaves out cuDNN's graphs with values of their own head "
                          "dim or a soft-cap score modifier"))
            << all;
      }
#endif
    }
    const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
    const ReferenceGradients g =
        reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
    const double tol = c.dtype == DeviceDType::fp32 ? 1e-4 : kHalfTolerance;
    EXPECT_LE(relative_error(out.data(), ref.out.data(), out.size()), tol);
    EXPECT_LE(relative_error(lse.data(), ref.lse.data(), lse.size()), tol);
    EXPECT_LE(relative_error(dq.data(), g.dq.data(), dq.size()), tol);
    EXPECT_LE(relative_error(dk.data(), g.dk.data(), dk.size()), tol);
    EXPECT_LE(relative_error(dv.data(), g.dv.data(), dv.size()), tol);
    if (c.cap > 0) {  // the cap changes the answer by far more than the tolerance
      AttentionConfig uncapped = cfg;
      uncapped.softcap = 0;
      const ReferenceForward u = reference_forward(uncapped, q.data(), k.data(), v.data());
      const std::vector<float> u32(u.out.begin(), u.out.end());
      EXPECT_GT(relative_error(u32.data(), ref.out.data(), u32.size()), 10 * tol);
    }
  }
}

// Values of their own head dim and soft-capped logits: the GPU's native kernels compute them
// on one GPU (ValueHeadDimAndSoftcapOnOneGpuMatchFloat64), the ring (test_cuda_ring's
// CudaRingMlaSoftcap), Ulysses (UlyssesOnVirtualRanksMatchesTheFloat64Reference) and
// block-sparse (CudaSparseRingFeatures.ValueHeadDimAndSoftcapMatchTheReference), so every
// GPU path takes such a job; device = auto keeps it on the CPU, saying why (no GPU has run
// those kernels yet).
TEST(EngineCuda, ValueHeadDimAndSoftcapRunOnEveryGpuPathAndStayOnTheCpuUnderAuto) {
  REQUIRE_GPU();
  auto subject_on = [](const JobSpec& spec, int ranks) {
    std::mutex m;
    std::vector<std::string> subjects;
    EXPECT_EQ(ring::run_virtual_ranks(ranks,
                                      [&](ring::Communicator& rc) {
                                        Comm comm = CommAccess::borrow(rc);
                                        std::string got = "(accepted)";
                                        try {
                                          (void)make_engine(spec, comm);
                                        } catch (const InputError& e) {
                                          got = e.subject();
                                        }
                                        std::lock_guard lock(m);
                                        subjects.push_back(got);
                                        return 0;
                                      }),
              0);
    return subjects;
  };
  for (const bool capped : {false, true}) {
    JobSpec spec = causal_job();
    spec.kernel = KernelChoice::automatic;
    if (capped)
      spec.config.softcap = 30;
    else
      spec.config.head_dim_v = 32;
    const std::string field = capped ? "config.softcap" : "config.head_dim_v";
    JobSpec sparse = spec;
    sparse.config.attention = AttentionKind::block_sparse;
    sparse.config.block_size = 32;
    sparse.block_sparse.pattern = "local:window=64";
    JobSpec ulysses = spec;
    ulysses.ulysses = 2;
    for (const auto& [what, job, ranks] : {std::tuple{"the ring", spec, 2},
                                           std::tuple{"block-sparse", sparse, 1},
                                           std::tuple{"block-sparse on two ranks", sparse, 2},
                                           std::tuple{"Ulysses", ulysses, 2}})
      for (const std::string& got : subject_on(job, ranks)) EXPECT_EQ(got, "(accepted)") << what;
    JobSpec automatic = spec;
    automatic.device = Device::automatic;
    Comm comm = Comm::single();
    try {  // a GPU dtype then says why the job is on the CPU
      (void)make_engine(automatic, comm);
      ADD_FAILURE() << "bf16 accepted on the CPU";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "dtype");
      EXPECT_NE(e.problem().find("no GPU has run the kernels that compute"), std::string::npos)
          << e.problem();
      EXPECT_NE(e.problem().find(field + "="), std::string::npos) << e.problem();
    }
    automatic.dtype.reset();
    Engine e = make_engine(automatic, comm);
    EXPECT_EQ(e.device(), Device::cpu);
    const EngineStats st = e.stats();
    ASSERT_FALSE(st.notes.empty());
    EXPECT_NE(st.notes.front().find("no GPU has run the kernels that compute"),
              std::string::npos)
        << st.notes.front();
    EXPECT_NE(st.notes.front().find(field + "="), std::string::npos) << st.notes.front();
  }
}

}  // namespace
}  // namespace ringattn
