// The CUDA block-sparse kernels (label `gpu`; `gpu-emu` under the emulated GPU, where none
// may skip) against the float64 block reference: every pattern generator (local, global,
// random, strided, dilated-blocks) and random masks with empty rows, causal and not, block
// sizes below, at and above the 64-row device tile, D 32..256 (aligned and not), bf16/fp16
// (relative error <= 1e-2) and fp32 (<= 1e-4), forward and gradients. The reference reads the
// mask itself (from a bool array) and the inputs as the device holds them (rounded to the
// dtype). Outputs are poisoned with NaN first, so an unwritten element fails. Also: the
// backward is bitwise the same on a second run; the forward's log-sum-exp merge mode (what
// the distributed plan uses for remote blocks) matches one pass over every span; under the
// emulator every kernel gives the same bytes in every execution mode. Shapes are small: an
// emulated kernel runs about a thousand times slower than a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

#include "cli_runner.hpp"
#include "gpu_skip.hpp"
#include "kernels/cuda/hopper/dense_backward.hpp"  // hopper_wide_backward_chosen
#include "kernels/cpu_block_sparse.hpp"
#include "random.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/reference.hpp"
#include "single/cuda_plan.hpp"
#include "sparse/cuda_sparse_plan.hpp"
#include "sparse/pattern.hpp"
#include "sparse/single_device_lists.hpp"
#if RINGATTN_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/native/sparse.hpp"
#endif
#if RINGATTN_CUDA_EMULATION
#include "emu/mode_sweep.hpp"
#include "emu/runtime.hpp"
#endif

namespace ringattn::sparse {
namespace {

#if RINGATTN_CUDA_EMULATION
// Devices 0 and 2 an sm_90, 1 and 3 an sm_86 (99 KiB of shared memory per block), unless the
// environment says otherwise: set before the emulated runtime's first use.
const bool kProfilesSet = setenv("RINGATTN_EMU_PROFILE", "sm_90,sm_86,sm_90,sm_86", 0) == 0;
#endif

double tolerance(DeviceDType t) { return t == DeviceDType::fp32 ? 1e-4 : 1e-2; }

struct Inputs {
  std::vector<float> q, k, v, dout;
};

// q and dout [B, N, H, D]; k and v [B, N, kv_heads, D] (kv_heads 0: H).
Inputs random_inputs(const Shape4& s, uint64_t seed, int64_t kv_heads = 0) {
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_kv =
      static_cast<std::size_t>(s.batch * s.seq_len * (kv_heads ? kv_heads : s.heads) * s.head_dim);
  return {testing::random_normal(n, seed), testing::random_normal(n_kv, seed + 1),
          testing::random_normal(n_kv, seed + 2), testing::random_normal(n, seed + 3)};
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
  std::string kernel;           // the plan's forward kernel
  std::string kernel_backward;  // and its backward's (set with the gradients)
  std::vector<std::string> notes;
};

std::vector<float> nan_filled(std::size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// One forward and (optionally) backward through CudaSparsePlan on `device`.
Result run_on_device(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                     DeviceDType t, const Inputs& in, bool backward, int device = 0,
                     KernelChoice kernel = KernelChoice::native, bool deterministic = false) {
  CudaSparsePlan plan(cfg, std::move(lists), {t, kernel, device, deterministic});
  EXPECT_EQ(plan.dtype(), t) << "the plan fell back to fp32";
  const Shape4& s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto nl = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  const std::size_t eb = bytes_per_element(t), in_bytes = n * eb;
  DeviceBuffer q(in_bytes, "q", device), k(n_kv * eb, "k", device), v(n_kv * eb, "v", device);
  q.upload(in.q.data(), n, t);
  k.upload(in.k.data(), n_kv, t);
  v.upload(in.v.data(), n_kv, t);
  DeviceBuffer out(n * 4, "out", device), lse(nl * 4, "lse", device);
  out.upload(nan_filled(n).data(), n, DeviceDType::fp32);
  lse.upload(nan_filled(nl).data(), nl, DeviceDType::fp32);
  plan.forward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>());
  plan.synchronize();
  Result r;
  r.kernel = plan.kernel_name();
  r.notes = plan.notes();
  r.out.resize(n);
  r.lse.resize(nl);
  out.download(r.out.data(), n);
  lse.download(r.lse.data(), nl);
  if (!backward) return r;
  DeviceBuffer dout(in_bytes, "dout", device), dq(n * 4, "dq", device), dk(n_kv * 4, "dk", device),
      dv(n_kv * 4, "dv", device);
  dout.upload(in.dout.data(), n, t);
  dq.upload(nan_filled(n).data(), n, DeviceDType::fp32);
  for (DeviceBuffer* g : {&dk, &dv}) g->upload(nan_filled(n_kv).data(), n_kv, DeviceDType::fp32);
  plan.backward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>(), dout.data(),
                dq.as<float>(), dk.as<float>(), dv.as<float>());
  plan.synchronize();
  r.kernel_backward = plan.backward_kernel_name();
  r.notes = plan.notes();
  r.dq.resize(n);
  r.dk.resize(n_kv);
  r.dv.resize(n_kv);
  dq.download(r.dq.data(), n);
  dk.download(r.dk.data(), n_kv);
  dv.download(r.dv.data(), n_kv);
  return r;
}

// The reference's statement of the mask: straight from a dense [H, nb, nb] bool array.
BlockReferenceProblem problem_of(const AttentionConfig& cfg, std::vector<uint8_t> mask) {
  const int64_t nb = cfg.shape.seq_len / cfg.block_size;
  BlockReferenceProblem pb = block_problem_of(cfg);
  pb.key_blocks = [mask = std::move(mask), nb](int64_t h, int64_t i) {
    std::vector<int64_t> out;
    for (int64_t j = 0; j < nb; ++j)
      if (mask[static_cast<std::size_t>((h * nb + i) * nb + j)]) out.push_back(j);
    return out;
  };
  return pb;
}

// Checks every tensor against the float64 reference of the rounded inputs; prints the
// errors so that a passing run still shows how close it was.
void expect_matches_reference(const std::string& label, const AttentionConfig& cfg,
                              const std::vector<uint8_t>& mask, DeviceDType t, Inputs in,
                              const Result& got) {
  for (std::vector<float>* x : {&in.q, &in.k, &in.v, &in.dout})
    round_to_device_dtype(x->data(), x->size(), t);
  const BlockReferenceProblem pb = problem_of(cfg, mask);
  const ReferenceForward f = reference_forward_blocks(pb, in.q.data(), in.k.data(), in.v.data());
  const double tol = tolerance(t);
  std::ostringstream report;
  report << label << " [" << to_string(t) << "]:";
  auto check = [&](const char* name, const std::vector<float>& g, const std::vector<double>& w) {
    const double e = relative_error(g.data(), w.data(), g.size());
    report << " " << name << " " << e;
    EXPECT_LE(e, tol) << label << ": " << name << " relative error " << e << " > " << tol << " ("
                      << to_string(t) << ")";
  };
  check("out", got.out, f.out);
  check("lse", got.lse, f.lse);
  if (!got.dq.empty()) {
    const ReferenceGradients g =
        reference_backward_blocks(pb, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
    check("dq", got.dq, g.dq);
    check("dk", got.dk, g.dk);
    check("dv", got.dv, g.dv);
  }
  std::printf("  %s\n", report.str().c_str());
}

// ---- the cases ----------------------------------------------------------------------------
struct SparseCase {
  const char* name;
  Shape4 shape;
  int64_t block_size;
  bool causal;
  DeviceDType dtype;
  // A --pattern text, or empty for a random per-head mask of `density` in which query block 1
  // of head 0 attends nothing.
  const char* pattern;
  double density;
  // Grouped-query attention, a sliding window (-1: none) and packed sequences (empty: none).
  int64_t kv_heads = 0, window = -1;
  std::vector<int64_t> seqlens = {};
};

void PrintTo(const SparseCase& c, std::ostream* os) { *os << c.name; }

AttentionConfig config_of(const SparseCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = c.block_size;
  cfg.causal = c.causal;
  if (c.kv_heads) cfg.kv_heads = c.kv_heads;
  if (c.window >= 0) cfg.window_left = c.window;
  if (!c.seqlens.empty()) {
    cfg.cu_seqlens = {0};
    for (int64_t len : c.seqlens) cfg.cu_seqlens.push_back(cfg.cu_seqlens.back() + len);
  }
  return cfg;
}

std::shared_ptr<const BlockLists> lists_of(const SparseCase& c) {
  const Geometry g{c.shape.seq_len, c.block_size, c.shape.heads};
  if (*c.pattern)
    return std::make_shared<const BlockLists>(
        build_lists(parse_pattern(c.pattern, g, {128, 256}, {1, 2}, 7), g));
  const int64_t nb = g.blocks(), h = c.shape.heads;
  std::mt19937_64 gen(static_cast<uint64_t>(nb * 977 + h));
  std::bernoulli_distribution keep(c.density);
  std::vector<uint8_t> mask(static_cast<std::size_t>(h * nb * nb));
  for (auto& m : mask) m = keep(gen) ? 1 : 0;
  for (int64_t j = 0; j < nb; ++j) mask[static_cast<std::size_t>(nb + j)] = 0;
  return std::make_shared<const BlockLists>(lists_from_mask(mask.data(), h, h, nb, c.block_size));
}

std::vector<SparseCase> cases() {
  using T = DeviceDType;
  return {
      // Generators, each with its own D, dtype and block size.
      {"local_bs64_D64_causal", {1, 256, 2, 64}, 64, true, T::bf16, "local:window=128", 0},
      {"global_bs64_D128", {1, 256, 1, 128}, 64, false, T::fp16, "global:blocks=1", 0},
      {"random_bs32_D32", {1, 256, 2, 32}, 32, false, T::bf16, "random:blocks=2", 0},
      {"strided_bs64_D96_causal", {1, 384, 1, 96}, 64, true, T::fp16, "strided:stride=2", 0},
      {"dilated_blocks_bs32_D64_causal", {1, 256, 2, 64}, 32, true, T::fp32, "dilated-blocks", 0},
      {"bigbird_bs32_D48",
       {1, 256, 1, 48},
       32,
       false,
       T::fp32,
       "bigbird:window=64,global=1,random=1",
       0},
      // Random masks with an empty query block: tiles larger than the device tile (two items
      // each), D = 256, batch 2, odd head dims on the fp32 path, tiny blocks.
      {"mask_bs128_D64_causal", {1, 256, 2, 64}, 128, true, T::bf16, "", 0.5},
      {"mask_bs64_D256", {1, 192, 1, 256}, 64, false, T::bf16, "", 0.5},
      {"mask_bs64_D256_causal", {1, 192, 1, 256}, 64, true, T::fp16, "", 0.6},
      {"mask_bs32_D128_batch2", {2, 128, 1, 128}, 32, false, T::fp16, "", 0.5},
      {"mask_bs16_D40", {1, 128, 2, 40}, 16, false, T::fp32, "", 0.3},
      {"mask_bs32_D256_causal", {1, 128, 1, 256}, 32, true, T::fp32, "", 0.6},
      // Grouped-query attention, sliding windows, packed sequences and their combinations.
      {"gqa_4to2_local_causal", {1, 256, 4, 64}, 64, true, T::bf16, "local:window=128", 0, 2},
      {"mqa_mask_bs32", {2, 128, 3, 32}, 32, false, T::fp32, "", 0.5, 1},
      {"window_40_bigbird",
       {1, 256, 2, 64},
       32,
       false,
       T::fp16,
       "bigbird:window=128,global=1",
       0,
       0,
       40},
      {"window_24_causal_gqa", {1, 256, 4, 128}, 64, true, T::bf16, "local:window=192", 0, 2, 24},
      {"window_0_fp32", {1, 128, 2, 48}, 16, false, T::fp32, "local:window=32", 0, 0, 0},
      {"packed_causal",
       {1, 256, 2, 64},
       32,
       true,
       T::bf16,
       "local:window=128+global",
       0,
       0,
       -1,
       {1, 70, 3, 150, 32}},
      {"packed_window_mqa_fp32", {1, 192, 2, 40}, 16, false, T::fp32, "", 0.6, 1, 20, {60, 1, 131}},
      {"packed_window_gqa_bs128",
       {1, 256, 4, 64},
       128,
       true,
       T::fp16,
       "local:window=256",
       0,
       2,
       50,
       {100, 156}},
  };
}

class CudaSparse : public ::testing::TestWithParam<SparseCase> {};

TEST_P(CudaSparse, ForwardAndGradientsMatchTheReference) {
  REQUIRE_GPU();
  const SparseCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  const auto lists = lists_of(c);
  const Inputs in = random_inputs(c.shape, 31 + static_cast<uint64_t>(c.shape.head_dim),
                                  cfg.effective_kv_heads());
  const Result got = run_on_device(cfg, lists, c.dtype, in, true);
  expect_matches_reference(c.name, cfg, mask_from_lists(*lists), c.dtype, in, got);
  if (!*c.pattern && c.window < 0 && c.seqlens.empty()) {
    // Query block 1 of head 0 attends nothing: out 0 and lse -inf, not NaN.
    const int64_t H = c.shape.heads, D = c.shape.head_dim;
    for (int64_t p = c.block_size; p < 2 * c.block_size; ++p) {
      EXPECT_EQ(got.lse[static_cast<std::size_t>(p)], -std::numeric_limits<float>::infinity());
      for (int64_t col = 0; col < D; ++col)
        EXPECT_EQ(got.out[static_cast<std::size_t>(p * H * D + col)], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Patterns, CudaSparse, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return std::string(p.param.name); });

// ---- the lists ----------------------------------------------------------------------------

// The device lists are the CPU kernels' own structs: the CPU kernels run on them unchanged
// and match the reference, which separates a wrong list from a wrong kernel.
TEST(SingleDeviceLists, TheCpuKernelsOnTheDeviceListsMatchTheReference) {
  // The lists are host code, but the device's rounding of the inputs is not.
  if (!cuda_built()) GTEST_SKIP() << "SKIPPED: this build has no CUDA kernels";
  for (bool causal : {false, true}) {
    const SparseCase c{"cpu",  {2, 256, 2, 32},   32,
                       causal, DeviceDType::fp32, "local:window=96+global:blocks=1+random:blocks=1",
                       0};
    const AttentionConfig cfg = config_of(c);
    const auto lists = lists_of(c);
    const SingleDeviceWork w = build_single_device_work(cfg, *lists, 64);
    const Inputs in = random_inputs(c.shape, 3);
    const auto n = static_cast<std::size_t>(c.shape.numel());
    const auto nl = static_cast<std::size_t>(c.shape.batch * c.shape.heads * c.shape.seq_len);
    Result r{nan_filled(n), nan_filled(nl), std::vector<float>(n), std::vector<float>(n),
             std::vector<float>(n), {}, {}, {}};
    std::vector<float> delta(nl);
    const kernels::TileConfig tc{64, 64};
    std::vector<float> ws(kernels::sparse_workspace_floats(tc, c.shape.head_dim));
    kernels::SparseParams p;
    p.q = in.q.data();
    p.k = in.k.data();
    p.v = in.v.data();
    p.out = r.out.data();
    p.lse = r.lse.data();
    p.head_dim = c.shape.head_dim;
    p.q_stride = w.q_stride;
    p.lse_stride = w.lse_stride;
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = causal;
    kernels::sparse_forward(p, w.q_tiles, w.key_spans, tc, 1, ws.data());
    const int64_t H = c.shape.heads, D = c.shape.head_dim, N = c.shape.seq_len;
    for (int64_t b = 0; b < c.shape.batch; ++b)
      for (int64_t t = 0; t < N; ++t)
        for (int64_t h = 0; h < H; ++h) {
          double s = 0;
          const std::size_t at = static_cast<std::size_t>(((b * N + t) * H + h) * D);
          for (int64_t col = 0; col < D; ++col)
            s += static_cast<double>(r.out[at + static_cast<std::size_t>(col)]) *
                 in.dout[at + static_cast<std::size_t>(col)];
          delta[static_cast<std::size_t>((b * H + h) * N + t)] = static_cast<float>(s);
        }
    p.delta = delta.data();
    p.dout = in.dout.data();
    p.dq = r.dq.data();
    p.dk = r.dk.data();
    p.dv = r.dv.data();
    kernels::sparse_backward_dq(p, w.q_tiles, w.key_spans, tc, 1, ws.data());
    kernels::sparse_backward_dkdv(p, w.k_tiles, w.query_spans, tc, 1, ws.data());
    expect_matches_reference(causal ? "cpu kernels, causal" : "cpu kernels", cfg,
                             mask_from_lists(*lists), DeviceDType::fp32, in, r);
  }
}

TEST(SingleDeviceLists, ALocalWindowIsOneSpanPerTileAndItemsCoverEveryRowOnce) {
  AttentionConfig cfg;
  cfg.shape = {1, 1024, 1, 64};
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = 128;
  const Geometry g{1024, 128, 1};
  const auto lists = build_lists(parse_pattern("local:window=640", g, {}, {}, 1), g);
  const SingleDeviceWork w = build_single_device_work(cfg, lists, 64);
  ASSERT_EQ(w.q_tiles.size(), 8u);
  for (const auto& t : w.q_tiles) EXPECT_EQ(t.n_spans, 1) << "contiguous key blocks merge";
  // Query spans of a key tile are one per query block, never merged: the CPU's fused and split
  // backward must cut (query chunk, key chunk) pairs alike (cpu_block_sparse.hpp).
  ASSERT_EQ(w.k_tiles.size(), 8u);
  for (std::size_t j = 0; j < w.k_tiles.size(); ++j) {
    const auto jj = static_cast<int64_t>(j);
    EXPECT_EQ(w.k_tiles[j].n_spans, std::min<int64_t>(jj + 2, 7) - std::max<int64_t>(jj - 2, 0) + 1)
        << "key block " << j;
  }
  // Every (tile, row) exactly once, in pieces of at most 64 rows, longest first.
  std::vector<int> seen(1024, 0);
  for (const auto& it : w.q_items) {
    const auto& t = w.q_tiles[static_cast<std::size_t>(it.task)];
    for (int64_t r = it.q_begin; r < std::min(it.q_begin + 64, t.n_q); ++r)
      ++seen[static_cast<std::size_t>(t.q_row0 / 64 + r)];
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  const auto& first = w.q_tiles[static_cast<std::size_t>(w.q_items.front().task)];
  const auto& last = w.q_tiles[static_cast<std::size_t>(w.q_items.back().task)];
  EXPECT_GE(w.key_spans[static_cast<std::size_t>(first.first_span)].n_k,
            w.key_spans[static_cast<std::size_t>(last.first_span)].n_k);
}

// ---- properties ---------------------------------------------------------------------------
TEST(CudaSparseKernels, BackwardIsBitwiseDeterministic) {
  REQUIRE_GPU();
  const SparseCase c{"det", {1, 256, 2, 64}, 64, true, DeviceDType::bf16, "bigbird", 0};
  const AttentionConfig cfg = config_of(c);
  const auto lists = lists_of(c);
  const Inputs in = random_inputs(c.shape, 99);
  const Result a = run_on_device(cfg, lists, c.dtype, in, true);
  const Result b = run_on_device(cfg, lists, c.dtype, in, true);
  for (auto [x, y, name] : {std::tuple{&a.out, &b.out, "out"},
                            {&a.lse, &b.lse, "lse"},
                            {&a.dq, &b.dq, "dq"},
                            {&a.dk, &b.dk, "dk"},
                            {&a.dv, &b.dv, "dv"}})
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0)
        << name << " differs between two identical runs";
}

bool has_note(const std::vector<std::string>& notes, const std::string& part) {
  for (const std::string& n : notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// --kernel hopper: the plan runs the forward and the backward on the sm_90a block-sparse
// kernels where they apply (the emulated sm_90s here) and gives what the float64 reference
// gives, and gradients within a few bf16 roundings of the native backward's (at D = 64, 128
// and 256); where they do not apply (an sm_86, fp32, D = 96) the native kernels run and a note
// says why.
TEST(CudaSparseKernels, KernelHopperRunsTheSm90aForwardOrSaysWhyNot) {
  REQUIRE_GPU();
  using T = DeviceDType;
  for (const SparseCase& c :
       {SparseCase{"hopper_gqa_window_causal", {1, 256, 4, 128}, 64, true, T::bf16,
                   "local:window=192", 0, 2, 24},
        SparseCase{"hopper_mask_bs32_batch2", {2, 128, 1, 64}, 32, false, T::fp16, "", 0.5},
        SparseCase{"hopper_packed_causal", {1, 256, 2, 64}, 32, true, T::bf16,
                   "local:window=128+global", 0, 0, -1, {1, 70, 3, 150, 32}},
        SparseCase{"hopper_d256", {1, 128, 1, 256}, 64, false, T::bf16, "local", 0},
        // 128-key tiles: the wide fused backward's whole blocks (RINGATTN_HOPPER_BWD=fused_wide)
        SparseCase{"hopper_bs128_causal", {1, 384, 2, 128}, 128, true, T::bf16,
                   "local:window=256+global", 0},
        // and at D = 64 (dQ's part split by keys, the two warpgroups' parts summed in sdQ)
        SparseCase{"hopper_bs128_d64", {1, 256, 2, 64}, 128, false, T::fp16,
                   "local:window=128+global", 0}}) {
    const AttentionConfig cfg = config_of(c);
    const auto lists = lists_of(c);
    const Inputs in = random_inputs(c.shape, 120, c.kv_heads);
    const Result got = run_on_device(cfg, lists, c.dtype, in, true, 0, KernelChoice::hopper);
#if RINGATTN_CUDA_EMULATION
    EXPECT_EQ(got.kernel, "hopper") << c.name;  // device 0 is an emulated sm_90
    EXPECT_EQ(testing::kernel_family(got.kernel_backward), "hopper") << c.name;
    if (c.block_size >= 128 && kernels::cuda::hopper_wide_backward_chosen(
                                   false, static_cast<int>(c.shape.head_dim))) {
      EXPECT_EQ(got.kernel_backward, "hopper-fused-wide") << c.name;
    }
#endif
    if (got.kernel != "hopper" || testing::kernel_family(got.kernel_backward) != "hopper") {
      EXPECT_TRUE(has_note(got.notes, "kernel=hopper: ")) << c.name;
    }
    expect_matches_reference(std::string(c.name) + " (" + got.kernel + ", " +
                                 got.kernel_backward + " backward)",
                             cfg, mask_from_lists(*lists), c.dtype, in, got);
    // The same gradients as the native backward, to within its rounding of P and dS.
    const Result native = run_on_device(cfg, lists, c.dtype, in, true, 0, KernelChoice::native);
    std::printf("  %s against the native backward:", c.name);
    for (auto [name, a, b] : {std::tuple{"dq", &got.dq, &native.dq}, {"dk", &got.dk, &native.dk},
                              {"dv", &got.dv, &native.dv}}) {
      const double e = relative_error(a->data(), b->data(), b->size());
      std::printf(" %s %.1e", name, e);
      EXPECT_LE(e, 5e-3) << c.name << ": " << name << " against the native backward";
    }
    std::printf("\n");
  }
#if RINGATTN_CUDA_EMULATION
  const SparseCase c{"hopper_refused", {1, 128, 1, 96}, 64, false, T::bf16, "local:window=128", 0};
  CudaSparsePlan d96(config_of(c), lists_of(c), {T::bf16, KernelChoice::hopper, 0});
  EXPECT_EQ(d96.kernel_name(), "native");
  EXPECT_EQ(d96.backward_kernel_name(), "native");
  EXPECT_TRUE(has_note(d96.notes(), "head dim 96")) << ::testing::PrintToString(d96.notes());
  const SparseCase c64{"hopper_sm86", {1, 128, 1, 64}, 64, false, T::bf16, "local:window=128", 0};
  CudaSparsePlan sm86(config_of(c64), lists_of(c64), {T::bf16, KernelChoice::hopper, 1});
  EXPECT_EQ(sm86.kernel_name(), "native");
  EXPECT_EQ(sm86.backward_kernel_name(), "native");
  EXPECT_TRUE(has_note(sm86.notes(), "compute capability 8.6"))
      << ::testing::PrintToString(sm86.notes());
  // --kernel auto: the sm_90a kernels where they run (the emulated sm_90), else native, each
  // with the note saying which and why.
  CudaSparsePlan auto90(config_of(c64), lists_of(c64), {T::bf16, KernelChoice::automatic, 0});
  EXPECT_EQ(auto90.kernel_name(), "hopper");
  EXPECT_EQ(testing::kernel_family(auto90.backward_kernel_name()), "hopper");
  EXPECT_TRUE(has_note(auto90.notes(),
                       "kernel=auto: the sm_90a block-sparse forward and "
                       "backward"))
      << ::testing::PrintToString(auto90.notes());
  CudaSparsePlan auto86(config_of(c64), lists_of(c64), {T::bf16, KernelChoice::automatic, 1});
  EXPECT_EQ(auto86.kernel_name(), "native");
  EXPECT_TRUE(has_note(auto86.notes(), "kernel=auto: the native block-sparse kernels"))
      << ::testing::PrintToString(auto86.notes());
  CudaSparsePlan auto_fp32(config_of(c64), lists_of(c64), {T::fp32, KernelChoice::automatic, 0});
  EXPECT_EQ(auto_fp32.kernel_name(), "native");
#endif
}

// --kernel auto times the block-sparse sm_90a backward in two passes against its fused kernel
// and (128-key tiles at D = 128) its wide fused kernel on the first backward and keeps the
// fastest (on a GPU; on the emulated one only with RINGATTN_HOPPER_BWD=auto: ctest
// hopper_sparse_auto_times_fused_backward), never when deterministic, and only the forms a
// GPU has passed (verified_forms.hpp; a note for each left out); the backward's kernel name
// says which ran, and the gradients match float64 whichever was kept.
TEST(CudaSparseKernels, AutoTimesTheFusedSm90aBackward) {
  REQUIRE_GPU();
  const SparseCase c{"auto_fused", {1, 256, 2, 128}, 128, true, DeviceDType::bf16,
                     "local:window=128", 0};
  const AttentionConfig cfg = config_of(c);
  const auto lists = lists_of(c);
  const Inputs in = random_inputs(c.shape, 130);
  const std::string env = testing::hopper_bwd_env();
  using kernels::cuda::GpuForm, kernels::cuda::GpuPath;
  const auto verified = [](GpuForm f) { return kernels::cuda::verified_on_gpu(f, GpuPath::sparse); };
  const auto run = [&](const std::string& label, bool deterministic) {
    const Result got = run_on_device(cfg, lists, c.dtype, in, true, 0, KernelChoice::automatic,
                                     deterministic);
    const std::string what = label + " (" + got.kernel_backward + " backward)";
    expect_matches_reference(what, cfg, mask_from_lists(*lists), c.dtype, in, got);
    if (testing::kernel_family(got.kernel_backward) != "hopper") return;  // not an sm_90
    const bool timed =
        testing::auto_times_fused_backward(env, GpuPath::sparse) && !deterministic;
    const std::string all = ::testing::PrintToString(got.notes);
    EXPECT_EQ(has_note(got.notes, "kernel=auto: the block-sparse sm_90a backward in two passes "),
              timed)
        << what << ": " << all;
    // The forward's forms too (plain, overlap, Q in registers).
    const bool forms_timed = !deterministic && testing::auto_times_forward_forms();
    EXPECT_EQ(has_note(got.notes, "kernel=auto: the block-sparse sm_90a forward plain "),
              forms_timed)
        << what << ": " << all;
    // Only what a GPU has passed is timed; each form left out has a note.
    const bool backward_would = testing::auto_would_time_backward(env) && !deterministic;
    EXPECT_EQ(has_note(got.notes, "leaves out the sm_90a backward's fused kernel:"),
              backward_would && !verified(GpuForm::hopper_backward_fused))
        << what << ": " << all;
    EXPECT_EQ(has_note(got.notes, "leaves out the sm_90a backward's wide fused kernel:"),
              backward_would && !verified(GpuForm::hopper_backward_fused_wide))
        << what << ": " << all;
    EXPECT_EQ(has_note(got.notes, "leaves out the sm_90a forward with Q in registers:"),
              forms_timed && !verified(GpuForm::hopper_forward_qregs))
        << what << ": " << all;
    if (timed) {
      EXPECT_TRUE(has_note(got.notes, " ms (median of 5); using the ")) << all;
      EXPECT_EQ(got.kernel_backward == "hopper-fused", has_note(got.notes, "using the fused kernel"))
          << all;
      EXPECT_EQ(has_note(got.notes, " ms, fused wide "),
                verified(GpuForm::hopper_backward_fused_wide))
          << all;
      EXPECT_EQ(got.kernel_backward == "hopper-fused-wide",
                has_note(got.notes, "using the wide fused kernel"))
          << all;
    } else if ((env != "fused" && env != "fused_wide") || deterministic) {
      EXPECT_EQ(got.kernel_backward, "hopper") << what;
    }
  };
  for (const bool deterministic : {false, true})
    run(std::string(c.name) + (deterministic ? " deterministic" : ""), deterministic);
#if RINGATTN_CUDA_EMULATION
  // The ctest entry says the forms are verified (RINGATTN_TEST_VERIFIED_FORMS), so that the
  // timing above runs; without that, none of them is, as on a GPU today.
  if (std::getenv("RINGATTN_TEST_VERIFIED_FORMS")) {
    const testing::EnvScope unverified("RINGATTN_TEST_VERIFIED_FORMS", nullptr);
    run(std::string(c.name) + ", fused forms unverified", false);
  }
#endif
}

TEST(CudaSparseKernels, CudnnIsRefusedNamingKernel) {
  REQUIRE_GPU();
  const SparseCase c{"cudnn", {1, 128, 1, 64}, 64, false, DeviceDType::bf16, "local", 0};
  try {
    CudaSparsePlan plan(config_of(c), lists_of(c), {DeviceDType::bf16, KernelChoice::cudnn, 0});
    ADD_FAILURE() << "--kernel cudnn accepted for block-sparse";
  } catch (const InputError& e) {
    EXPECT_EQ(e.subject(), "kernel") << e.what();
  }
}

// The GPU kernels read [B, N, H, D] only: [B, H, N, D] tensors (--layout bhnd) are bad input
// naming --layout, before any device work.
TEST(CudaSparseKernels, HeadMajorTensorsAreRefusedNamingLayout) {
  REQUIRE_GPU();
  const SparseCase c{"bhnd", {1, 128, 2, 64}, 64, false, DeviceDType::bf16, "local", 0};
  AttentionConfig cfg = config_of(c);
  cfg.layout = TensorLayout::bhnd;
  try {
    CudaSparsePlan plan(cfg, lists_of(c), {DeviceDType::bf16, KernelChoice::native, 0});
    ADD_FAILURE() << "--layout bhnd accepted by the GPU block-sparse plan";
  } catch (const InputError& e) {
    EXPECT_EQ(e.subject(), "config.layout") << e.what();
  }
}

// The CLI runs block-sparse on the GPU when asked (one rank), checks it against the float64
// reference at the dtype's tolerance, and refuses cuDNN naming --kernel.
TEST(CudaSparseCli, DeviceCudaRunsBlockSparseAndPassesItsCheck) {
  REQUIRE_GPU();
  for (const char* dtype : {"bf16", "fp32"}) {
    const testing::CliResult r = testing::run_cli({"run",
                                                   "--device",
                                                   "cuda",
                                                   "--attention",
                                                   "block-sparse",
                                                   "--pattern",
                                                   "bigbird",
                                                   "--seq-len",
                                                   "256",
                                                   "--heads",
                                                   "2",
                                                   "--head-dim",
                                                   "64",
                                                   "--block-size",
                                                   "64",
                                                   "--causal",
                                                   "--backward",
                                                   "--check",
                                                   "--dtype",
                                                   dtype,
                                                   "--iters",
                                                   "1",
                                                   "--warmup",
                                                   "0",
                                                   "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("block-sparse attention on cuda"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("-> OK"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("inputs ") + dtype), std::string::npos) << r.out;
  }
  const testing::CliResult r = testing::run_cli(
      {"run", "--device", "cuda", "--attention", "block-sparse", "--pattern", "local", "--seq-len",
       "256", "--heads", "1", "--head-dim", "64", "--block-size", "64", "--kernel", "cudnn"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--kernel"), std::string::npos) << r.err;
}

#if RINGATTN_TEST_HAVE_CUDA
// The forward's merge mode, as the distributed plan uses it for remote blocks: each tile's
// spans split in two lists, the first pass writing and the second merging by log-sum-exp,
// gives the one-pass answer. Every tensor-core head dim and the fp32 path.
TEST(CudaSparseKernels, AccumulatingForwardMergesSpanSubsetsByLogSumExp) {
  REQUIRE_GPU();
  namespace kc = kernels::cuda;
  for (auto [d, t] : {std::pair{64, DeviceDType::bf16},
                      {128, DeviceDType::fp16},
                      {256, DeviceDType::bf16},
                      {72, DeviceDType::fp32}}) {
    const SparseCase c{"merge", {1, 256, 1, d}, 64, true, t, "local:window=256+global:blocks=1", 0};
    const AttentionConfig cfg = config_of(c);
    const auto lists = lists_of(c);
    const SingleDeviceWork w = build_single_device_work(cfg, *lists, 64);
    // First pass: the first span of every tile; second: the rest (some tiles have none).
    std::vector<kernels::SparseQueryTile> first = w.q_tiles, rest = w.q_tiles;
    for (std::size_t i = 0; i < w.q_tiles.size(); ++i) {
      first[i].n_spans = std::min<int64_t>(1, w.q_tiles[i].n_spans);
      rest[i].first_span = w.q_tiles[i].first_span + first[i].n_spans;
      rest[i].n_spans = w.q_tiles[i].n_spans - first[i].n_spans;
    }
    const Inputs in = random_inputs(c.shape, 17);
    const auto n = static_cast<std::size_t>(c.shape.numel());
    const auto nl = static_cast<std::size_t>(c.shape.seq_len);
    const std::size_t in_bytes = n * bytes_per_element(t);
    DeviceBuffer q(in_bytes, "q"), k(in_bytes, "k"), v(in_bytes, "v"), out(n * 4, "out"),
        lse(nl * 4, "lse");
    q.upload(in.q.data(), n, t);
    k.upload(in.k.data(), n, t);
    v.upload(in.v.data(), n, t);
    out.upload(nan_filled(n).data(), n, DeviceDType::fp32);
    lse.upload(nan_filled(nl).data(), nl, DeviceDType::fp32);
    auto upload = [](const auto& vec, const char* what) {
      DeviceBuffer b(vec.size() * sizeof(vec[0]), what);
      EXPECT_EQ(cudaMemcpy(b.data(), vec.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
      return b;
    };
    const DeviceBuffer d_first = upload(first, "tiles"), d_rest = upload(rest, "tiles"),
                       d_spans = upload(w.key_spans, "spans"), d_items = upload(w.q_items, "items");
    kc::SparseForwardParams p;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.out = out.as<float>();
    p.lse = lse.as<float>();
    p.spans = d_spans.as<kernels::KeySpan>();
    p.items = d_items.as<kernels::ForwardItem>();
    p.n_items = static_cast<int64_t>(w.q_items.size());
    p.q_stride = w.q_stride;
    p.lse_stride = w.lse_stride;
    p.head_dim = static_cast<int>(d);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = true;
    const kc::Elem e = t == DeviceDType::bf16   ? kc::Elem::bf16
                       : t == DeviceDType::fp16 ? kc::Elem::fp16
                                                : kc::Elem::fp32;
    p.tiles = d_first.as<kernels::SparseQueryTile>();
    kc::sparse_forward(e, p, nullptr);
    p.tiles = d_rest.as<kernels::SparseQueryTile>();
    p.accumulate = true;
    kc::sparse_forward(e, p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Result r;
    r.out.resize(n);
    r.lse.resize(nl);
    out.download(r.out.data(), n);
    lse.download(r.lse.data(), nl);
    expect_matches_reference("merge D" + std::to_string(d), cfg, mask_from_lists(*lists), t, in, r);
  }
}
#endif

#if RINGATTN_CUDA_EMULATION
std::vector<std::byte> bytes_of(const Result& r) {
  std::vector<std::byte> b;
  for (const std::vector<float>* x : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv}) {
    const auto* p = reinterpret_cast<const std::byte*>(x->data());
    b.insert(b.end(), p, p + x->size() * sizeof(float));
  }
  return b;
}
// Every block-sparse instantiation gives bitwise the same bytes under every execution mode
// (warp orders per barrier interval, cp.async landing at the copy or at the wait): no
// barrier or cp.async wait is missing. On an sm_90 and an sm_86 profile for D = 256.
TEST(CudaSparseEmulated, EveryKernelIsBitwiseIndependentOfWarpOrderAndCpAsyncLanding) {
  ASSERT_TRUE(kProfilesSet);
  const std::vector<emu::ExecutionMode> modes = emu::standard_modes();
  const SparseCase sweep[] = {
      {"D64_bf16_causal", {1, 192, 1, 64}, 64, true, DeviceDType::bf16, "local:window=128", 0},
      {"D128_fp16_bs32", {1, 128, 1, 128}, 32, true, DeviceDType::fp16, "local:window=64", 0},
      {"D256_bf16", {1, 128, 1, 256}, 64, false, DeviceDType::bf16, "local:window=64", 0},
      {"D40_fp32", {1, 128, 1, 40}, 32, true, DeviceDType::fp32, "local:window=64", 0},
  };
  for (const SparseCase& c : sweep) {
    const AttentionConfig cfg = config_of(c);
    const auto lists = lists_of(c);
    const Inputs in = random_inputs(c.shape, 41);
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    const bool both = c.shape.head_dim == 256 && count > 1;
    for (int device = 0; device < (both ? 2 : 1); ++device) {
      const auto differs = emu::find_mode_dependence(
          [&] { return bytes_of(run_on_device(cfg, lists, c.dtype, in, true, device)); }, modes);
      EXPECT_FALSE(differs.has_value()) << c.name << ": " << *differs;
      std::printf("  %s on %s: the same bytes under %zu modes\n", c.name,
                  emu::runtime::device_profile(device).arch, modes.size());
    }
  }
}
#endif

}  // namespace
}  // namespace ringattn::sparse
