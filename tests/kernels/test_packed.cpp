// Packed variable-length sequences (--seqlens / --cu-seqlens) on one process. The float64
// reference is checked against running each document on its own (a packed run is the
// documents side by side); then the CPU plan against the reference for packing combined with
// causality, windows and grouped-query attention, and its determinism.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "plan_runner.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/reference.hpp"
#include "single/plan.hpp"

namespace ringattn {
namespace {

using testing::PlanResult;
using testing::random_tensors;
using testing::run_plan;
using testing::Tensors;

struct PackedCase {
  Shape4 shape;
  int64_t kv_heads;
  std::vector<int64_t> lengths;
  bool causal;
  int64_t window;  // -1: none
};

std::string name_of(const PackedCase& c) {
  std::ostringstream os;
  os << "B" << c.shape.batch << "N" << c.shape.seq_len << "H" << c.shape.heads << "KV" << c.kv_heads
     << "D" << c.shape.head_dim << "_docs" << c.lengths.size();
  if (c.window >= 0) os << "_W" << c.window;
  if (c.causal) os << "_causal";
  return os.str();
}

AttentionConfig config_of(const PackedCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.kv_heads = c.kv_heads;
  cfg.causal = c.causal;
  if (c.window >= 0) cfg.window_left = c.window;
  cfg.cu_seqlens = {0};
  for (int64_t len : c.lengths) cfg.cu_seqlens.push_back(cfg.cu_seqlens.back() + len);
  return cfg;
}

// Rows [begin, begin + len) of every batch row of a [B, N, heads, D] tensor.
std::vector<float> slice_rows(const std::vector<float>& x, const Shape4& s, int64_t heads,
                              int64_t begin, int64_t len) {
  const int64_t row = heads * s.head_dim;
  std::vector<float> out;
  for (int64_t b = 0; b < s.batch; ++b)
    out.insert(out.end(), x.begin() + (b * s.seq_len + begin) * row,
               x.begin() + (b * s.seq_len + begin + len) * row);
  return out;
}

// Names, not raw bytes (pointers included), in the discovered test list.
void PrintTo(const PackedCase& c, std::ostream* os) { *os << name_of(c); }

std::vector<PackedCase> cases() {
  std::vector<PackedCase> v;
  for (bool causal : {false, true}) {
    v.push_back({{1, 70, 2, 16}, 2, {1, 30, 1, 38}, causal, -1});
    v.push_back({{2, 90, 4, 8}, 2, {45, 45}, causal, 6});
    v.push_back({{1, 64, 4, 16}, 1, {10, 54}, causal, 0});
    v.push_back({{1, 80, 2, 8}, 2, {80}, causal, 500});
  }
  return v;
}

class PackedReference : public ::testing::TestWithParam<PackedCase> {};

TEST_P(PackedReference, IsEachDocumentOnItsOwn) {
  const PackedCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  const Tensors in = random_tensors(cfg, 11);
  const ReferenceForward all = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients g_all =
      reference_backward(cfg, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  const Shape4& s = cfg.shape;
  const int64_t kv = cfg.effective_kv_heads();
  for (std::size_t d = 0; d + 1 < cfg.cu_seqlens.size(); ++d) {
    const int64_t begin = cfg.cu_seqlens[d], len = cfg.cu_seqlens[d + 1] - begin;
    AttentionConfig one = cfg;
    one.cu_seqlens.clear();
    one.shape.seq_len = len;
    const auto q = slice_rows(in.q, s, s.heads, begin, len);
    const auto k = slice_rows(in.k, s, kv, begin, len);
    const auto v = slice_rows(in.v, s, kv, begin, len);
    const auto dout = slice_rows(in.dout, s, s.heads, begin, len);
    const ReferenceForward f = reference_forward(one, q.data(), k.data(), v.data());
    const ReferenceGradients g = reference_backward(one, q.data(), k.data(), v.data(), dout.data());
    auto expect_rows = [&](const std::vector<double>& packed, const std::vector<double>& alone,
                           int64_t heads, const char* what) {
      const int64_t row = heads * s.head_dim;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < len * row; ++i)
          ASSERT_EQ(packed[static_cast<std::size_t>((b * s.seq_len + begin) * row + i)],
                    alone[static_cast<std::size_t>(b * len * row + i)])
              << what << " document " << d;
    };
    expect_rows(all.out, f.out, s.heads, "out");
    expect_rows(g_all.dq, g.dq, s.heads, "dq");
    expect_rows(g_all.dk, g.dk, kv, "dk");
    expect_rows(g_all.dv, g.dv, kv, "dv");
    for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(all.lse[static_cast<std::size_t>(bh * s.seq_len + begin + i)],
                  f.lse[static_cast<std::size_t>(bh * len + i)])
            << "lse document " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackedReference, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return name_of(p.param); });

// ---- the CPU plan ------------------------------------------------------------------------

struct PlanCase {
  PackedCase c;
  int64_t q_tile, k_tile;  // 0: automatic
};

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> v;
  for (bool causal : {false, true}) {
    v.push_back({{{1, 200, 2, 16}, 2, {1, 60, 3, 100, 36}, causal, -1}, 32, 48});
    v.push_back({{{2, 150, 4, 16}, 1, {70, 1, 79}, causal, -1}, 16, 32});   // MQA
    v.push_back({{{1, 240, 6, 24}, 2, {17, 200, 23}, causal, 9}, 32, 64});  // GQA x window
    v.push_back({{{1, 128, 4, 8}, 4, std::vector<int64_t>(128, 1), causal, -1}, 16, 16});
    v.push_back({{{1, 300, 2, 32}, 2, {150, 150}, causal, 2}, 0, 0});  // automatic tiles
    v.push_back({{{1, 160, 2, 16}, 2, {60, 100}, causal, 1000}, 32, 48});
  }
  return v;
}

std::string plan_name(const PlanCase& pc) {
  std::string name = name_of(pc.c);
  if (pc.q_tile) name += "_t" + std::to_string(pc.q_tile) + "x" + std::to_string(pc.k_tile);
  return name;
}

void PrintTo(const PlanCase& pc, std::ostream* os) { *os << plan_name(pc); }

class PackedPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PackedPlan, MatchesFloat64Reference) {
  const PlanCase& pc = GetParam();
  const AttentionConfig cfg = config_of(pc.c);
  const Tensors in = random_tensors(cfg, std::hash<std::string>{}(plan_name(pc)));
  const PlanResult got = run_plan(cfg, in, PlanOptions{2, pc.q_tile, pc.k_tile});
  testing::expect_matches_float64(cfg, in, got);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackedPlan, ::testing::ValuesIn(plan_cases()),
                         [](const auto& p) { return plan_name(p.param); });

TEST(PackedPlan, ResultsAreBitwiseIdenticalAcrossThreadCounts) {
  for (const PackedCase& c : {PackedCase{{2, 256, 4, 32}, 2, {100, 1, 155}, true, -1},
                              PackedCase{{1, 300, 1, 16}, 1, {150, 150}, false, 20}}) {
    SCOPED_TRACE(name_of(c));
    const AttentionConfig cfg = config_of(c);
    const Tensors in = random_tensors(cfg, 5);
    testing::expect_same_bits_for_thread_counts(cfg, in, {2, 3});
  }
}

// One document covering the sequence is the unpacked run, bit for bit.
TEST(PackedPlan, OneDocumentGivesTheUnpackedBits) {
  for (bool causal : {false, true}) {
    AttentionConfig cfg;
    cfg.shape = {1, 200, 2, 16};
    cfg.causal = causal;
    const Tensors in = random_tensors(cfg, 9);
    const std::vector<float> plain = run_plan(cfg, in, PlanOptions{2, 32, 48}).all();
    cfg.cu_seqlens = {0, 200};
    const std::vector<float> packed = run_plan(cfg, in, PlanOptions{2, 32, 48}).all();
    EXPECT_EQ(0, std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float))) << causal;
  }
}

TEST(PackedConfig, BadOffsetsAndCombinationsNameSeqlens) {
  AttentionConfig cfg;
  cfg.shape = {1, 10, 2, 8};
  auto subject = [&] {
    try {
      validate(cfg);
    } catch (const InputError& e) {
      return e.subject() + ": " + e.problem();
    }
    return std::string("accepted");
  };
  cfg.cu_seqlens = {0, 4, 9};
  EXPECT_NE(subject().find("config.cu_seqlens: the document lengths sum to 9"), std::string::npos)
      << subject();
  cfg.cu_seqlens = {0, 4, 4, 10};
  EXPECT_NE(subject().find("config.cu_seqlens: document 1 has length 0"), std::string::npos)
      << subject();
  cfg.cu_seqlens = {0, 5, 10};
  EXPECT_EQ(subject(), "accepted");
  cfg.attention = AttentionKind::dilated;
  cfg.segments = {5};
  cfg.dilations = {1};
  EXPECT_NE(subject().find(
                "config.cu_seqlens: packed sequences do not combine with config.attention=dilated"),
            std::string::npos)
      << subject();
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = 5;
  EXPECT_EQ(subject(), "accepted");  // block-sparse takes packed sequences
}

}  // namespace
}  // namespace ringattn
