// What only the emulated GPU can show (label gpu-emu, emulated builds only; ctest runs it
// with devices 0 and 2 as sm_90 and 1 and 3 as sm_86):
//  - every kernel instantiation gives bitwise the same result under every execution mode
//    (warp orders per barrier interval, cp.async landing at the copy or at the wait), so no
//    barrier or cp.async wait is missing, on both device profiles;
//  - the emulated runtime refuses what the real one refuses (an event recorded on a stream
//    of another device, a launch onto another device's stream, dynamic shared memory past
//    the default 48 KiB without cudaFuncSetAttribute, or past the device's opt-in limit),
//    and a kernel fault becomes the device's sticky error naming the kernel, block, thread;
//  - streams are ordered only by events: cudaStreamWaitEvent makes one wait for another;
//  - two blocks of one launch storing to one global address is a fault (the ring's dK/dV add
//    over repeated rows, the race a lent H200 found).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "emu/mode_sweep.hpp"
#include "emu/runtime.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/hopper/dense_backward.hpp"
#include "kernels/cuda/hopper/dense_forward.hpp"
#include "kernels/cuda/hopper/sparse_backward.hpp"
#include "kernels/cuda/hopper/sparse_forward.hpp"
#include "random.hpp"
#include "single/cuda_plan.hpp"
#include "sparse/block_lists.hpp"
#include "sparse/cuda_sparse_plan.hpp"
#include "sparse/pattern.hpp"
#include "sparse/single_device_lists.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn {
namespace {

// Devices 0 and 2 an sm_90, 1 and 3 an sm_86, unless the environment says otherwise: set
// before the emulated runtime's first use (it reads the variable once).
const bool kProfilesSet = setenv("RINGATTN_EMU_PROFILE", "sm_90,sm_86,sm_90,sm_86", 0) == 0;

// ---- every instantiation, every mode, both profiles ---------------------------------------
std::vector<std::byte> bytes_;  // the last Hopper run's output (ASSERTs need a void lambda)
struct SweepCase {
  int64_t head_dim;
  DeviceDType dtype;
  bool causal;
};

std::string name_of(const SweepCase& c) {
  return "D" + std::to_string(c.head_dim) + "_" + to_string(c.dtype) + (c.causal ? "_causal" : "");
}

// out, lse, dq, dk, dv of one forward and backward on `device`, as bytes.
std::vector<std::byte> run_plan(const AttentionConfig& cfg, DeviceDType t, int device,
                                KernelChoice kernel = KernelChoice::native) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto nl = static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len);
  const std::size_t in_bytes = n * bytes_per_element(t);
  CudaPlan plan(cfg, {t, kernel, device});
  if (kernel == KernelChoice::hopper && device == 0) {
    EXPECT_EQ(plan.kernel_name(), "hopper");
  }
  DeviceBuffer q(in_bytes, "q", device), k(in_bytes, "k", device), v(in_bytes, "v", device),
      dout(in_bytes, "dout", device);
  DeviceBuffer out(n * 4, "out", device), lse(nl * 4, "lse", device), dq(n * 4, "dq", device),
      dk(n * 4, "dk", device), dv(n * 4, "dv", device);
  uint64_t seed = 41;
  for (DeviceBuffer* b : {&q, &k, &v, &dout})
    b->upload(testing::random_normal(n, seed++).data(), n, t);
  for (DeviceBuffer* b : {&dq, &dk, &dv}) b->zero();
  plan.forward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>());
  plan.backward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>(), dout.data(),
                dq.as<float>(), dk.as<float>(), dv.as<float>());
  plan.synchronize();
  std::vector<std::byte> bytes;
  for (auto [buf, count] : {std::pair{&out, n}, {&lse, nl}, {&dq, n}, {&dk, n}, {&dv, n}}) {
    std::vector<float> host(count);
    buf->download(host.data(), count);
    const auto* b = reinterpret_cast<const std::byte*>(host.data());
    bytes.insert(bytes.end(), b, b + count * sizeof(float));
  }
  return bytes;
}

// gtest prints parameters into test names; without this it would print the raw bytes.
void PrintTo(const SweepCase& c, std::ostream* os) { *os << name_of(c); }

class EmulatedModes : public ::testing::TestWithParam<SweepCase> {};

TEST_P(EmulatedModes, EveryKernelIsBitwiseIndependentOfWarpOrderAndCpAsyncLanding) {
  const SweepCase& c = GetParam();
  AttentionConfig cfg;
  // Partial query and key tiles (136 = 2·64 + 8), two heads, and the causal diagonal.
  cfg.shape = {1, 136, 2, c.head_dim};
  cfg.causal = c.causal;
  const std::vector<emu::ExecutionMode> modes = emu::standard_modes();
  for (int device : {0, 1}) {
    const auto& profile = emu::runtime::device_profile(device);
    const auto differs =
        emu::find_mode_dependence([&] { return run_plan(cfg, c.dtype, device); }, modes);
    EXPECT_FALSE(differs.has_value()) << name_of(c) << " on " << profile.arch << ": " << *differs;
    std::printf("  %s on %s: the same bytes under %zu modes\n", name_of(c).c_str(), profile.arch,
                modes.size());
  }
}

std::vector<SweepCase> sweep_cases() {
  std::vector<SweepCase> v;
  for (int64_t d : {64, 128, 256})
    for (DeviceDType t : {DeviceDType::bf16, DeviceDType::fp16}) v.push_back({d, t, true});
  v.push_back({256, DeviceDType::bf16, false});  // the D = 256 K double buffer's full loop
  v.push_back({96, DeviceDType::fp32, true});    // the fp32 CUDA-core kernels
  return v;
}

INSTANTIATE_TEST_SUITE_P(Kernels, EmulatedModes, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& p) { return name_of(p.param); });

// One dense Hopper run on device 0 (bf16, or fp16 with `fp16`; B = 1, N = 200, scale 1/8,
// heads 2 on one K/V head), as bytes: out and lse of the forward, and with `backward` dq, dk
// and dv of the backward after it (start_backward's zeroed gradients and row sums, as a plan
// runs it). Modes: dense, causal, a window of 70 left and 10 right, causal packed documents.
// With `fused_dq`, the backward is the fused kernel (the wide one with `wide`, D = 64 or 128): its
// dq (summed by bulk reductions in the order blocks run, which the modes change) goes there,
// and the bytes are out, lse, dk, dv. `head_dim_v` (0: head_dim): v, out, dout and dv's.
std::vector<std::byte> hopper_run(int head_dim, int mode, bool backward, bool fp16 = false,
                                  std::vector<float>* fused_dq = nullptr, bool wide = false,
                                  int head_dim_v = 0) {
  const DeviceDType t = fp16 ? DeviceDType::fp16 : DeviceDType::bf16;
  kernels::cuda::HopperAttention a;
  a.elem = fp16 ? kernels::cuda::Elem::fp16 : kernels::cuda::Elem::bf16;
  a.batch = 1, a.seq_len = 200, a.heads = 2, a.kv_heads = 1, a.head_dim = head_dim;
  a.head_dim_v = head_dim_v;
  a.scale = 0.125f;
  a.causal = mode == 1 || mode == 3;
  if (mode == 2) a.window_left = 70, a.window_right = 10;
  const auto n = static_cast<std::size_t>(a.seq_len * a.heads * a.head_dim);
  const auto n_o = static_cast<std::size_t>(a.seq_len * a.heads * a.value_dim());
  const auto n_kv = static_cast<std::size_t>(a.seq_len * a.kv_heads * a.head_dim);
  const auto n_v = static_cast<std::size_t>(a.seq_len * a.kv_heads * a.value_dim());
  const auto nl = static_cast<std::size_t>(a.seq_len * a.heads);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceBuffer q(n * 2, "q", 0), k(n_kv * 2, "k", 0), v(n_v * 2, "v", 0),
      dout(n_o * 2, "dout", 0), out(n_o * 4, "out", 0), lse(nl * 4, "lse", 0),
      delta(nl * 4, "delta", 0), dq(n * 4, "dq", 0), dk(n_kv * 4, "dk", 0), dv(n_v * 4, "dv", 0);
  q.upload(testing::random_normal(n, 71).data(), n, t);
  k.upload(testing::random_normal(n_kv, 72).data(), n_kv, t);
  v.upload(testing::random_normal(n_v, 73).data(), n_v, t);
  dout.upload(testing::random_normal(n_o, 74).data(), n_o, t);
  const int cu_host[] = {0, 1, 90, 200};
  DeviceBuffer cu(sizeof cu_host, "cu_seqlens", 0);
  EXPECT_EQ(cudaMemcpy(cu.data(), cu_host, sizeof cu_host, cudaMemcpyHostToDevice), cudaSuccess);
  if (mode == 3) a.cu_seqlens = static_cast<const int*>(cu.data()), a.n_docs = 3;
  kernels::cuda::HopperForwardParams f;
  static_cast<kernels::cuda::HopperAttention&>(f) = a;
  f.q = q.data(), f.k = k.data(), f.v = v.data(), f.out = out.as<float>(), f.lse = lse.as<float>();
  kernels::cuda::hopper_forward(f, nullptr);
  std::vector<std::pair<DeviceBuffer*, std::size_t>> results{{&out, n_o}, {&lse, nl}};
  if (backward) {
    kernels::cuda::start_backward(a.elem,
                                  {out.as<float>(), dout.data(), delta.as<float>(), a.batch,
                                   a.seq_len, a.heads, a.value_dim()},
                                  a.kv_heads, dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                  nullptr, a.head_dim);
    kernels::cuda::HopperBackwardParams b;
    static_cast<kernels::cuda::HopperAttention&>(b) = a;
    b.q = q.data(), b.k = k.data(), b.v = v.data(), b.dout = dout.data();
    b.lse = lse.as<float>(), b.delta = delta.as<float>();
    b.dq = dq.as<float>(), b.dk = dk.as<float>(), b.dv = dv.as<float>();
    b.fused = fused_dq != nullptr;
    b.wide = wide;
    kernels::cuda::hopper_backward(b, nullptr);
    if (!b.fused) results.push_back({&dq, n});
    results.insert(results.end(), {{&dk, n_kv}, {&dv, n_v}});
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (backward && fused_dq) {
    fused_dq->resize(n);
    dq.download(fused_dq->data(), n);
  }
  std::vector<std::byte> bytes;
  for (auto [buf, count] : results) {
    std::vector<float> host(count);
    buf->download(host.data(), count);
    const auto* p = reinterpret_cast<const std::byte*>(host.data());
    bytes.insert(bytes.end(), p, p + count * sizeof(float));
  }
  return bytes;
}

// A hopper_run case of the two sweeps below.
struct HopperCase {
  int d, mode;
  bool fp16;
};

// The Hopper forward (producer and consumer warpgroups, mbarrier pipeline, TMA, wgmma): the
// same bytes under every execution mode, TMA and wgmma results landing at the issue or at
// the wait; on the sm_86 device it declines, naming the compute capability.
TEST(EmulatedModes, HopperForwardIsBitwiseIndependentOfWarpOrderAndLanding) {
  // D = 64 in every mode, D = 256 causal; fp16 at D = 128 causal
  for (const auto& [d, mode, fp16] :
       {HopperCase{64, 0, false}, HopperCase{64, 1, false}, HopperCase{64, 2, false},
        HopperCase{64, 3, false}, HopperCase{256, 1, false}, HopperCase{128, 1, true}}) {
    if (d == 256 && kernels::cuda::hopper_qregs_forced()) continue;  // D <= 128's form only
    const auto differs = emu::find_mode_dependence([&] { return hopper_run(d, mode, false, fp16); },
                                                   emu::standard_modes());
    EXPECT_FALSE(differs.has_value())
        << "D " << d << " mode " << mode << (fp16 ? " fp16" : "") << ": " << *differs;
  }
  kernels::cuda::HopperForwardParams sm86;
  sm86.heads = 2, sm86.kv_heads = 1, sm86.head_dim = 64;
  const std::string why = kernels::cuda::hopper_forward_unsupported(sm86, 1);
  EXPECT_NE(why.find("compute capability 8.6"), std::string::npos) << why;
}

// The Hopper forward and backward over a dilated schedule's strided views (a launch per view,
// passes merged by log-sum-exp, the mixture's out_scale and the backward's dout_scale, dK/dV
// ranges in turn; a dilation of 3 that divides neither N nor the first segment): the same
// bytes under every execution mode.
TEST(EmulatedModes, HopperDilatedForwardIsBitwiseIndependentOfWarpOrderAndLanding) {
  AttentionConfig cfg;
  cfg.shape = {1, 200, 3, 64};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::mixture;
  cfg.segments = {100, 200};
  cfg.dilations = {3, 2};
  cfg.causal = true;
  const auto differs = emu::find_mode_dependence(
      [&] { return run_plan(cfg, DeviceDType::bf16, 0, KernelChoice::hopper); },
      emu::standard_modes());
  EXPECT_FALSE(differs.has_value()) << *differs;
}

// The Hopper backward (its dK/dV pass walking both query heads of the K/V head, and its dQ
// pass), after the forward: the same bytes under every execution mode, at D = 64 in every
// mode, at D = 128 causal and at D = 256 causal (dV and dK as two launches), and in fp16 at
// D = 128 with the window; on the sm_86 device it declines, naming the compute capability.
TEST(EmulatedModes, HopperBackwardIsBitwiseIndependentOfWarpOrderAndLanding) {
  for (const auto& [d, mode, fp16] :
       {HopperCase{64, 0, false}, HopperCase{64, 1, false}, HopperCase{64, 2, false},
        HopperCase{64, 3, false}, HopperCase{128, 1, false}, HopperCase{256, 1, false},
        HopperCase{128, 2, true}}) {
    if (d == 256 && kernels::cuda::hopper_qregs_forced()) continue;  // D <= 128's form only
    const auto differs = emu::find_mode_dependence([&] { return hopper_run(d, mode, true, fp16); },
                                                   emu::standard_modes());
    EXPECT_FALSE(differs.has_value())
        << "D " << d << " mode " << mode << (fp16 ? " fp16" : "") << ": " << *differs;
    std::printf("  hopper backward D%d mode %d%s: the same bytes under %zu modes\n", d, mode,
                fp16 ? " fp16" : "", emu::standard_modes().size());
  }
  kernels::cuda::HopperBackwardParams sm86;
  sm86.heads = 2, sm86.kv_heads = 1, sm86.head_dim = 64;
  const std::string why = kernels::cuda::hopper_backward_unsupported(sm86, 1);
  EXPECT_NE(why.find("compute capability 8.6"), std::string::npos) << why;
}

// The fused Hopper backward (a producer thread's TMA, the stats warp's lse and delta, the
// drain warp's bulk reductions, named barriers between them and the consumers): dK and dV, one
// writer each, the same bytes under every execution mode, and dQ, added by blocks in the order
// they run, within fp32 summation order of the first mode's. A stage refilled before its last
// read, or stats or staged dQ rows read before they were written, would show here. The wide
// kernel (two consumer warpgroups over 128 keys) too: at D = 128 one warpgroup's dS box read
// before the other wrote it, or its dQ columns staged over a Q the other still reads; at
// D = 64 (dQ's part split by keys) one warpgroup's part added before the other stored its own.
// And at 192/128 (dV's launch, then dK's with dQ's part staged in an sdQ of its own).
TEST(EmulatedModes, HopperFusedBackwardIsIndependentOfWarpOrderAndLanding) {
  struct Case {
    HopperCase c;
    bool wide;
    int dv = 0;
  };
  for (const auto& [hc, wide, dv] :
       {Case{{64, 1, false}, false}, Case{{128, 2, false}, false}, Case{{64, 3, true}, false},
        Case{{128, 1, false}, true}, Case{{128, 3, true}, true}, Case{{64, 1, false}, true},
        Case{{64, 3, true}, true}, Case{{192, 1, false}, false, 128}}) {
    const auto [d, mode, fp16] = hc;
    std::vector<std::vector<float>> dqs;
    const auto differs = emu::find_mode_dependence(
        [&] {
          dqs.emplace_back();
          return hopper_run(d, mode, true, fp16, &dqs.back(), wide, dv);
        },
        emu::standard_modes());
    EXPECT_FALSE(differs.has_value())
        << "D " << d << " mode " << mode << (fp16 ? " fp16" : "") << ": " << *differs;
    double worst = 0;
    for (const std::vector<float>& dq : dqs) {
      ASSERT_EQ(dq.size(), dqs.front().size());
      for (std::size_t i = 0; i < dq.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(dq[i]) - dqs.front()[i]) /
                                    (std::abs(static_cast<double>(dqs.front()[i])) + 1e-3));
    }
    // fp32 sums in another order: 1e-5 at D <= 128, up to 2.5e-5 at 192/128 (mode 0); a race
    // shows as 1e1-1e3.
    EXPECT_LE(worst, 4e-5) << "D " << d << " mode " << mode << ": dq across modes";
    std::printf("  %s backward D%d%s mode %d%s: dk, dv the same bytes and dq within %.1e "
                "under %zu modes\n",
                wide ? "wide fused" : "fused", d, dv ? "/128" : "", mode, fp16 ? " fp16" : "",
                worst, emu::standard_modes().size());
  }
}

// The Hopper block-sparse forward (the same pipeline walking key spans): the same bytes under
// every execution mode, for a written pass and a log-sum-exp merge pass over the rest of each
// tile's spans (the merge reads the old lse in every lane of a row before one writes it);
// causal local + global blocks with a window (spans longer than a key tile, cut by the
// window), and a random mask of 32-row blocks (items of 32 rows, spans off the 64 grid). On
// the sm_86 device it declines, naming the compute capability.
TEST(EmulatedModes, HopperSparseForwardIsBitwiseIndependentOfWarpOrderAndLanding) {
  struct Case {
    int64_t block_size, head_dim;
    bool causal;
    DeviceDType dtype;
    const char* pattern;  // empty: a random mask
  };
  for (const Case& c : {Case{64, 64, true, DeviceDType::bf16, "local:window=128+global:blocks=1"},
                        Case{32, 128, false, DeviceDType::fp16, ""}}) {
    AttentionConfig cfg;
    cfg.shape = {1, 384, 2, c.head_dim};
    cfg.attention = AttentionKind::block_sparse;
    cfg.block_size = c.block_size;
    cfg.causal = c.causal;
    cfg.kv_heads = 1;
    if (c.causal) cfg.window_left = 100;
    const sparse::Geometry g{cfg.shape.seq_len, c.block_size, cfg.shape.heads};
    sparse::BlockLists lists;
    if (*c.pattern) {
      lists = sparse::build_lists(sparse::parse_pattern(c.pattern, g, {}, {}, 7), g);
    } else {
      const int64_t nb = g.blocks();
      std::vector<uint8_t> mask(static_cast<std::size_t>(2 * nb * nb));
      for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 2654435761u) % 7 == 0;
      lists = sparse::lists_from_mask(mask.data(), 2, 2, nb, c.block_size);
    }
    const sparse::SingleDeviceWork w = sparse::build_single_device_work(cfg, lists, 64);
    std::vector<kernels::SparseQueryTile> first = w.q_tiles, rest = w.q_tiles;
    for (std::size_t i = 0; i < first.size(); ++i) {
      first[i].n_spans = std::min<int64_t>(1, rest[i].n_spans);
      rest[i].first_span += first[i].n_spans;
      rest[i].n_spans -= first[i].n_spans;
    }
    const auto n = static_cast<std::size_t>(cfg.shape.numel());
    const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
    const auto nl = static_cast<std::size_t>(cfg.shape.heads * cfg.shape.seq_len);
    const kernels::cuda::Elem e =
        c.dtype == DeviceDType::bf16 ? kernels::cuda::Elem::bf16 : kernels::cuda::Elem::fp16;
    const kernels::cuda::HopperSparseShape shape{1, static_cast<int>(cfg.shape.seq_len), 2, 1};
    auto run = [&] {
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      DeviceBuffer q(n * 2, "q", 0), k(n_kv * 2, "k", 0), v(n_kv * 2, "v", 0), out(n * 4, "out", 0),
          lse(nl * 4, "lse", 0);
      q.upload(testing::random_normal(n, 74).data(), n, c.dtype);
      k.upload(testing::random_normal(n_kv, 75).data(), n_kv, c.dtype);
      v.upload(testing::random_normal(n_kv, 76).data(), n_kv, c.dtype);
      DeviceBuffer d_first(first.size() * sizeof(first[0]), "tiles", 0),
          d_rest(rest.size() * sizeof(rest[0]), "tiles", 0),
          d_spans(w.key_spans.size() * sizeof(w.key_spans[0]), "spans", 0),
          d_items(w.q_items.size() * sizeof(w.q_items[0]), "items", 0);
      for (auto [buf, src] : {std::pair<DeviceBuffer*, const void*>{&d_first, first.data()},
                              {&d_rest, rest.data()},
                              {&d_spans, w.key_spans.data()},
                              {&d_items, w.q_items.data()}})
        ASSERT_EQ(cudaMemcpy(buf->data(), src, buf->bytes(), cudaMemcpyHostToDevice), cudaSuccess);
      kernels::cuda::SparseForwardParams p;
      p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.as<float>(),
      p.lse = lse.as<float>();
      p.spans = d_spans.as<kernels::KeySpan>();
      p.items = d_items.as<kernels::ForwardItem>();
      p.n_items = static_cast<int64_t>(w.q_items.size());
      p.q_stride = w.q_stride, p.lse_stride = w.lse_stride;
      p.head_dim = static_cast<int>(c.head_dim);
      p.scale = 0.1f;
      p.causal = c.causal;
      const sparse::WindowLimits win = sparse::kernel_window(cfg);
      p.window_left = win.left, p.window_right = win.right;
      p.tiles = d_first.as<kernels::SparseQueryTile>();
      kernels::cuda::hopper_sparse_forward(e, p, shape, nullptr);
      p.tiles = d_rest.as<kernels::SparseQueryTile>();
      p.accumulate = true;
      kernels::cuda::hopper_sparse_forward(e, p, shape, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> host(n + nl);
      out.download(host.data(), n);
      lse.download(host.data() + n, nl);
      bytes_ =
          std::vector<std::byte>(reinterpret_cast<const std::byte*>(host.data()),
                                 reinterpret_cast<const std::byte*>(host.data() + host.size()));
    };
    const auto differs = emu::find_mode_dependence(
        [&] {
          run();
          return bytes_;
        },
        emu::standard_modes());
    EXPECT_FALSE(differs.has_value())
        << "D" << c.head_dim << " bs " << c.block_size << ": " << *differs;
    if (!differs)
      std::printf("  hopper sparse D%lld bs %lld %s: the same bytes under %zu modes\n",
                  static_cast<long long>(c.head_dim), static_cast<long long>(c.block_size),
                  to_string(c.dtype), emu::standard_modes().size());
  }
  kernels::cuda::SparseForwardParams sm86;
  sm86.head_dim = 64, sm86.q_stride = 128;
  const std::string why = kernels::cuda::hopper_sparse_forward_unsupported(
      kernels::cuda::Elem::bf16, sm86, {1, 64, 2, 1}, 1);
  EXPECT_NE(why.find("compute capability 8.6"), std::string::npos) << why;
}

// The Hopper block-sparse backward through the plan (--kernel hopper: the local blocks'
// forward and backward on sm_90a; one rank, so every block is local): the same bytes of out,
// lse, dq, dk and dv under every execution mode; causal local + global blocks of 32 rows with
// a window (query spans off the 64 grid, cut by the window, both query heads of the K/V head
// walked by the dK/dV pass) at D = 64, and a random mask of 3/4 of the 64-row blocks at
// D = 128 (items that walk three tiles or more, so each ring stage is reused).
TEST(EmulatedModes, HopperSparseBackwardIsBitwiseIndependentOfWarpOrderAndLanding) {
  struct Case {
    int64_t block_size, head_dim;
    bool causal;
    DeviceDType dtype;
    const char* pattern;  // empty: a random mask
  };
  for (const Case& c : {Case{32, 64, true, DeviceDType::bf16, "local:window=96+global:blocks=1"},
                        Case{64, 128, false, DeviceDType::fp16, ""}}) {
    AttentionConfig cfg;
    cfg.shape = {1, 256, 2, c.head_dim};
    cfg.attention = AttentionKind::block_sparse;
    cfg.block_size = c.block_size;
    cfg.causal = c.causal;
    cfg.kv_heads = 1;
    if (c.causal) cfg.window_left = 70;
    const sparse::Geometry g{cfg.shape.seq_len, c.block_size, cfg.shape.heads};
    sparse::BlockLists lists;
    if (*c.pattern) {
      lists = sparse::build_lists(sparse::parse_pattern(c.pattern, g, {}, {}, 7), g);
    } else {
      const int64_t nb = g.blocks();
      std::vector<uint8_t> mask(static_cast<std::size_t>(2 * nb * nb));
      for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 2654435761u) % 4 != 0;
      lists = sparse::lists_from_mask(mask.data(), 2, 2, nb, c.block_size);
    }
    const auto shared = std::make_shared<const sparse::BlockLists>(std::move(lists));
    const auto n = static_cast<std::size_t>(cfg.shape.numel());
    const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
    const auto nl = static_cast<std::size_t>(cfg.shape.heads * cfg.shape.seq_len);
    std::string chosen;
    auto run = [&] {
      sparse::CudaSparsePlan plan(cfg, shared, {c.dtype, KernelChoice::hopper, 0});
      chosen = plan.kernel_name() + "/" + plan.backward_kernel_name();
      DeviceBuffer q(n * 2, "q", 0), k(n_kv * 2, "k", 0), v(n_kv * 2, "v", 0),
          dout(n * 2, "dout", 0), out(n * 4, "out", 0), lse(nl * 4, "lse", 0), dq(n * 4, "dq", 0),
          dk(n_kv * 4, "dk", 0), dv(n_kv * 4, "dv", 0);
      q.upload(testing::random_normal(n, 84).data(), n, c.dtype);
      k.upload(testing::random_normal(n_kv, 85).data(), n_kv, c.dtype);
      v.upload(testing::random_normal(n_kv, 86).data(), n_kv, c.dtype);
      dout.upload(testing::random_normal(n, 87).data(), n, c.dtype);
      plan.forward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>());
      plan.backward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>(), dout.data(),
                    dq.as<float>(), dk.as<float>(), dv.as<float>());
      plan.synchronize();
      std::vector<std::byte> bytes;
      for (auto [buf, count] :
           {std::pair{&out, n}, {&lse, nl}, {&dq, n}, {&dk, n_kv}, {&dv, n_kv}}) {
        std::vector<float> host(count);
        buf->download(host.data(), count);
        const auto* b = reinterpret_cast<const std::byte*>(host.data());
        bytes.insert(bytes.end(), b, b + count * sizeof(float));
      }
      return bytes;
    };
    const auto differs = emu::find_mode_dependence(run, emu::standard_modes());
    EXPECT_EQ(chosen, "hopper/hopper");
    EXPECT_FALSE(differs.has_value())
        << "D" << c.head_dim << " bs " << c.block_size << ": " << *differs;
    if (!differs)
      std::printf("  hopper sparse backward D%lld bs %lld %s: the same bytes under %zu modes\n",
                  static_cast<long long>(c.head_dim), static_cast<long long>(c.block_size),
                  to_string(c.dtype), emu::standard_modes().size());
  }
  kernels::cuda::SparseBackwardParams sm86;
  sm86.head_dim = 64, sm86.q_stride = 128;
  const std::string why = kernels::cuda::hopper_sparse_backward_unsupported(
      kernels::cuda::Elem::bf16, sm86, {1, 64, 2, 1}, 1);
  EXPECT_NE(why.find("compute capability 8.6"), std::string::npos) << why;
}

TEST(EmulatedDevices, ProfilesAreTheOnesTheTestAskedFor) {
  ASSERT_TRUE(kProfilesSet);
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_GE(count, 2);
  int optin0 = 0, optin1 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&optin0, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&optin1, cudaDevAttrMaxSharedMemoryPerBlockOptin, 1),
            cudaSuccess);
  EXPECT_EQ(optin0, 232448);  // sm_90: 227 KiB
  EXPECT_EQ(optin1, 101376);  // sm_86: 99 KiB
  const CudaDeviceStatus s = probe_cuda_device(1);
  EXPECT_TRUE(s.usable && s.emulated) << s.reason;
  EXPECT_NE(s.name.find("emulated sm_86"), std::string::npos) << s.name;
}

// ---- the runtime's rules ------------------------------------------------------------------
__global__ void write_index(int* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] =
      static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
}

// Half the block waits at a barrier the other half never reaches: a fault on the device.
__global__ void barrier_reached_by_half(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1;
  }
}

__global__ void uses_shared(int* out) {
  const kernels::cuda::SmemPtr<int> s = kernels::cuda::dynamic_smem<int>();
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Each test that breaks a device resets it, so the next test finds it clean.
struct ResetDevices {
  ~ResetDevices() {
    int count = 0;
    (void)cudaGetDeviceCount(&count);
    for (int d = 0; d < count; ++d) {
      (void)cudaSetDevice(d);
      (void)cudaDeviceReset();
    }
    (void)cudaSetDevice(0);
  }
};

TEST(EmulatedRuntime, AnEventRecordedOnAStreamOfAnotherDeviceIsAnInvalidHandle) {
  ResetDevices reset;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaEvent_t event = nullptr;  // created on device 0, as a thread that forgot cudaSetDevice
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(event, stream), cudaErrorInvalidResourceHandle);
  const std::string why = cudaGetErrorString(cudaErrorInvalidResourceHandle);
  std::printf("  %s\n", why.c_str());
  EXPECT_NE(why.find("device 0"), std::string::npos) << why;
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not a sticky error";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaEvent_t right = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&right, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(right, stream), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(right), cudaSuccess);
  cudaEventDestroy(right);
  cudaEventDestroy(event);
  cudaStreamDestroy(stream);
}

TEST(EmulatedRuntime, ALaunchOntoAnotherDevicesStreamIsRefused) {
  ResetDevices reset;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  kernels::cuda::launch_kernel("write_index", &write_index, dim3(1), dim3(64), 0, stream, out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  kernels::cuda::launch_kernel("write_index", &write_index, dim3(1), dim3(64), 0, stream, out);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> host(64);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), out, 64 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(host[static_cast<std::size_t>(i)], i);
  cudaFree(out);
  cudaStreamDestroy(stream);
}

TEST(EmulatedRuntime, DynamicSharedMemoryPastTheDefaultNeedsTheAttributeAndTheOptInLimit) {
  ResetDevices reset;
  for (int device : {0, 1}) {
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    const auto& profile = emu::runtime::device_profile(device);
    int* out = nullptr;
    ASSERT_EQ(cudaMalloc(&out, 128 * sizeof(int)), cudaSuccess);
    const std::size_t big = 64 * 1024;  // past 48 KiB, within both opt-in limits
    kernels::cuda::launch_kernel("uses_shared", &uses_shared, dim3(1), dim3(128), big, nullptr,
                                 out);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << profile.arch;
    const std::string why = cudaGetErrorString(cudaErrorInvalidValue);
    EXPECT_NE(why.find("uses_shared"), std::string::npos) << why;
    EXPECT_NE(why.find("cudaFuncSetAttribute"), std::string::npos) << why;
    // Past the device's opt-in limit even the attribute is refused.
    EXPECT_EQ(cudaFuncSetAttribute(&uses_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(profile.shared_per_block_optin) + 16),
              cudaErrorInvalidValue);
    (void)cudaGetLastError();
    ASSERT_EQ(cudaFuncSetAttribute(&uses_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(big)),
              cudaSuccess);
    kernels::cuda::launch_kernel("uses_shared", &uses_shared, dim3(1), dim3(128), big, nullptr,
                                 out);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << profile.arch;
    std::vector<int> host(128);
    ASSERT_EQ(cudaMemcpy(host.data(), out, 128 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 128; ++i) EXPECT_EQ(host[static_cast<std::size_t>(i)], (i + 1) % 128);
    cudaFree(out);
  }
}

TEST(EmulatedRuntime, AKernelFaultIsTheDevicesStickyErrorNamingKernelBlockAndThread) {
  ResetDevices reset;
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  kernels::cuda::launch_kernel("barrier_reached_by_half", &barrier_reached_by_half, dim3(3),
                               dim3(64), 0, nullptr, out);
  // The launch itself is valid; the kernel runs on the stream's worker, and when it has
  // already faulted by now (a busy machine lets it), the sticky error shows here, as a GPU's
  // would.
  const cudaError_t launched = cudaGetLastError();
  ASSERT_TRUE(launched == cudaSuccess || launched == cudaErrorLaunchFailure) << launched;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::string why = cudaGetErrorString(cudaErrorLaunchFailure);
  std::printf("  %s\n", why.c_str());
  EXPECT_NE(why.find("barrier_reached_by_half"), std::string::npos) << why;
  EXPECT_NE(why.find("block ("), std::string::npos) << why;
  EXPECT_NE(why.find("thread ("), std::string::npos) << why;
  // Sticky: every later call on the device reports it, as on a GPU.
  int* more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 16), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  // Other devices are unaffected.
  ASSERT_EQ(cudaSetDevice(3), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&more, 16), cudaSuccess);
  cudaFree(more);
}

// dK/dV rows returned by the ring, added in parallel where two runs name one row (a K/V head
// serving two patterns): blocks of the parallel add (one warp per packed row, 8 rows a block)
// then add to the same rows, a race the emulator's check of races between blocks reports
// naming both blocks; the add that serves repeated rows (one thread per column) has none.
TEST(EmulatedRuntime, TheParallelRowAddOverRepeatedRowsIsARaceBetweenBlocks) {
  ResetDevices reset;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  constexpr int64_t kRows = 8, kDim = 32;
  // Two runs of 8 packed rows each naming dk/dv rows 0..7: packed rows 0..7 fall in block 0
  // of the parallel add and rows 8..15 in block 1.
  const kernels::cuda::PackedRun host_runs[2] = {{0, kDim, kRows, 0, 0},
                                                 {0, kDim, kRows, kRows, kRows}};
  kernels::cuda::PackedRun* runs = nullptr;
  float *buf = nullptr, *dk = nullptr, *dv = nullptr;
  ASSERT_EQ(cudaMalloc(&runs, sizeof host_runs), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(runs, host_runs, sizeof host_runs, cudaMemcpyHostToDevice), cudaSuccess);
  const std::vector<float> ones(static_cast<std::size_t>(4 * kRows * kDim), 1.0f);
  ASSERT_EQ(cudaMalloc(&buf, ones.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(buf, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dk, kRows * kDim * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dv, kRows * kDim * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dk, 0, kRows * kDim * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dv, 0, kRows * kDim * sizeof(float)), cudaSuccess);
  const kernels::cuda::PackParams p{runs, 2, 2 * kRows, 2 * kRows, kDim};
  // Serving repeated rows: each element gets both runs' adds, no fault.
  kernels::cuda::launch_unpack_add_rows(p, buf, dk, dv, /*rows_may_repeat=*/true, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(static_cast<std::size_t>(kRows * kDim));
  ASSERT_EQ(cudaMemcpy(got.data(), dk, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, std::vector<float>(got.size(), 2.0f));
  // The parallel add over the same runs: a race between blocks 0 and 1. The fault surfaces at
  // the synchronisation, or at the launch's own check when the emulator has already run the
  // kernel by then (as a fast GPU may): either way, naming both blocks.
  std::string why;
  try {
    kernels::cuda::launch_unpack_add_rows(p, buf, dk, dv, /*rows_may_repeat=*/false, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    why = cudaGetErrorString(cudaErrorLaunchFailure);
  } catch (const std::exception& e) {
    why = e.what();
  }
  std::printf("  %s\n", why.c_str());
  for (const char* part : {"'unpack_add_kernel' block (", "block (0,0,0)", "block (1,0,0)",
                           "of this launch also stores to with plain stores"})
    EXPECT_NE(why.find(part), std::string::npos) << why;
}

TEST(EmulatedRuntime, StreamWaitEventOrdersWorkAcrossStreams) {
  ResetDevices reset;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  constexpr std::size_t n = 1 << 16;
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  int *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, n * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, n * sizeof(int)), cudaSuccess);
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  for (int round = 0; round < 20; ++round) {
    // a: a slow writer (many blocks); b: copies once a has written.
    ASSERT_EQ(cudaMemsetAsync(src, 0, n * sizeof(int), a), cudaSuccess);
    kernels::cuda::launch_kernel("write_index", &write_index, dim3(n / 256), dim3(256), 0, a, src);
    ASSERT_EQ(cudaEventRecord(written, a), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(b, written, 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(dst, src, n * sizeof(int), cudaMemcpyDeviceToDevice, b), cudaSuccess);
    std::vector<int> host(n);
    ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), dst, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(host[n - 1], static_cast<int>(n - 1)) << "round " << round;
  }
  cudaEventDestroy(written);
  cudaFree(src);
  cudaFree(dst);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST(EmulatedRuntime, CopiesOfHostOrUnknownPointersAsDeviceMemoryAreRefused) {
  ResetDevices reset;
  std::vector<float> host(16);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 16 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 8, 8 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 17 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue)
      << "past the end of the allocation";
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
}

}  // namespace
}  // namespace ringattn
