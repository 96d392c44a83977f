// The library API on GPUs (label gpu; gpu-emu under the emulated GPU): make_engine with
// Device::cuda on one rank and on virtual ranks sharing a GPU, host calls (staged through
// the device) against the float64 reference of the inputs rounded to the device dtype, the
// TensorRef path on device buffers giving the host path's bits, and the transport refused
// by name. Without a usable device every test is skipped with the reason.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
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
// batches: forward and gradients against float64, bytes against their minimum.
TEST(EngineCuda, UlyssesOnVirtualRanksMatchesTheFloat64Reference) {
  REQUIRE_GPU();
  JobSpec spec = causal_job();
  spec.config.shape = {2, 128, 4, 64};
  spec.config.kv_heads = 2;
  const Shape4& s = spec.config.shape;
  const Shape4 skv = spec.config.kv_shape();
  auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 11),
       k = testing::random_normal(static_cast<std::size_t>(skv.numel()), 12),
       v = testing::random_normal(static_cast<std::size_t>(skv.numel()), 13),
       dout = testing::random_normal(static_cast<std::size_t>(s.numel()), 14);
  for (auto* t : {&q, &k, &v, &dout})
    round_to_device_dtype(t->data(), t->size(), DeviceDType::bf16);
  const ReferenceForward ref = reference_forward(spec.config, q.data(), k.data(), v.data());
  const ReferenceGradients g =
      reference_backward(spec.config, q.data(), k.data(), v.data(), dout.data());
  const std::vector<float> want(ref.out.begin(), ref.out.end()), want_dq(g.dq.begin(), g.dq.end()),
      want_dk(g.dk.begin(), g.dk.end()), want_dv(g.dv.begin(), g.dv.end());
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
  // stand-in: cudnn_graphs_emulated.cpp).
  std::vector<std::pair<int, KernelChoice>> runs = {{2, KernelChoice::native},
                                                    {4, KernelChoice::native}};
#if RINGATTN_TEST_HAVE_CUDNN
  runs.emplace_back(4, KernelChoice::cudnn);
#endif
#if RINGATTN_TEST_HAVE_CUDNN || RINGATTN_CUDA_EMULATION
  runs.emplace_back(2, KernelChoice::cudnn);
#endif
#if RINGATTN_CUDA_EMULATION
  const testing::CudnnStandinScope standin;
#endif
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
              const int64_t inner = s.heads * s.head_dim, inner_kv = skv.heads * s.head_dim;
              const auto lq = rows_of(q, rows, inner), lk = rows_of(k, rows, inner_kv),
                         lv = rows_of(v, rows, inner_kv), ld = rows_of(dout, rows, inner);
              std::vector<float> out(lq.size()), dq(lq.size()), dk(lk.size()), dv(lk.size()),
                  lse(static_cast<std::size_t>(s.batch * s.heads) * rows.size());
              e.forward(lq.data(), lk.data(), lv.data(), out.data(), lse.data());
              e.backward(lq.data(), lk.data(), lv.data(), out.data(), lse.data(), ld.data(),
                         dq.data(), dk.data(), dv.data());
              const EngineStats st = e.stats();
              const double errs[] = {
                  relative_error(out.data(), rows_of(want, rows, inner).data(), out.size()),
                  relative_error(dq.data(), rows_of(want_dq, rows, inner).data(), dq.size()),
                  relative_error(dk.data(), rows_of(want_dk, rows, inner_kv).data(), dk.size()),
                  relative_error(dv.data(), rows_of(want_dv, rows, inner_kv).data(), dv.size())};
              bool good = st.ulysses == u && st.bytes_sent == st.bytes_sent_min &&
                          st.bytes_sent_a2a == st.bytes_sent_a2a_min;
              if (kernel == KernelChoice::cudnn)
                good = good && st.kernel == "cudnn" && st.kernel_backward == "cudnn";
              for (const double err : errs) good = good && err <= kHalfTolerance;
              if (good) {
                ++ok;
              } else {
                std::lock_guard lock(m);
                failures.push_back("U " + std::to_string(u) + " rank " +
                                   std::to_string(comm.rank()) + ": " + st.engine + " (kernel " +
                                   st.kernel + ", backward " + st.kernel_backward + "), bytes " +
                                   std::to_string(st.bytes_sent) + "/" +
                                   std::to_string(st.bytes_sent_min) + ", errors " +
                                   std::to_string(errs[0]) + " " + std::to_string(errs[1]) + " " +
                                   std::to_string(errs[2]) + " " + std::to_string(errs[3]));
              }
              return 0;
            }),
        0);
    for (const std::string& f : failures) ADD_FAILURE() << f;
    EXPECT_EQ(ok.load(), 4) << "U " << u << ", kernel " << to_string(kernel);
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
                                        if (e.subject() == "--comm") ++refused;
                                      }
                                      return 0;
                                    }),
            0);
  EXPECT_EQ(refused.load(), 2);
}

}  // namespace
}  // namespace ringattn
