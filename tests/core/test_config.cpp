// Config validation (each error names its option) and the pattern arithmetic, checked
// against brute-force evaluation of the definitions.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/patterns.hpp"
#include "ringattn/config.hpp"
#include "ringattn/errors.hpp"

namespace ringattn {
namespace {

AttentionConfig dilated(Shape4 s, std::vector<int64_t> w, std::vector<int64_t> r, Combine c,
                        bool causal = false) {
  AttentionConfig cfg;
  cfg.shape = s;
  cfg.attention = AttentionKind::dilated;
  cfg.combine = c;
  cfg.segments = std::move(w);
  cfg.dilations = std::move(r);
  cfg.causal = causal;
  return cfg;
}

std::string subject_of(const AttentionConfig& cfg) {
  try {
    validate(cfg);
  } catch (const InputError& e) {
    return e.subject();
  }
  return "";
}

TEST(ConfigValidation, EachBadFieldNamesItsOption) {
  const Shape4 s{1, 64, 4, 16};
  EXPECT_EQ(subject_of(dilated(s, {16, 32}, {1}, Combine::grouped)), "config.segments");
  EXPECT_EQ(subject_of(dilated(s, {}, {}, Combine::grouped)), "config.segments");
  EXPECT_EQ(subject_of(dilated(s, {16}, {}, Combine::grouped)), "config.dilations");
  EXPECT_EQ(subject_of(dilated(s, {0}, {1}, Combine::grouped)), "config.segments");
  EXPECT_EQ(subject_of(dilated(s, {16}, {-1}, Combine::grouped)), "config.dilations");
  EXPECT_EQ(subject_of(dilated(s, {24}, {1}, Combine::grouped)), "config.segments");
  EXPECT_EQ(subject_of(dilated({1, 64, 2, 16}, {16, 32, 64}, {1, 2, 4}, Combine::grouped)),
            "config.shape.heads");
  EXPECT_EQ(subject_of(dilated({1, 64, 2, 16}, {16, 32, 64}, {1, 2, 4}, Combine::mixture)), "");
  EXPECT_EQ(subject_of(dilated({1, 64, 4, 0}, {64}, {1}, Combine::grouped)),
            "config.shape.head_dim");
  EXPECT_EQ(subject_of(dilated({1, 64, 4, kMaxHeadDim + 1}, {64}, {1}, Combine::grouped)),
            "config.shape.head_dim");
  EXPECT_EQ(subject_of(dilated({0, 64, 4, 8}, {64}, {1}, Combine::grouped)), "config.shape.batch");
  EXPECT_EQ(subject_of(dilated(s, {16}, {17}, Combine::grouped)), "");  // dilation > segment: legal
  AttentionConfig bad_scale = dilated(s, {16}, {1}, Combine::grouped);
  bad_scale.scale = -1.0;
  EXPECT_EQ(subject_of(bad_scale), "config.scale");
}

TEST(ConfigValidation, KvHeadsMustBePositiveAndDivideTheQueryHeads) {
  AttentionConfig cfg;
  cfg.shape = {1, 64, 8, 16};
  EXPECT_EQ(cfg.effective_kv_heads(), 8);  // default: multi-head
  EXPECT_EQ(subject_of(cfg), "");
  for (int64_t ok : {8, 4, 2, 1}) {
    cfg.kv_heads = ok;
    EXPECT_EQ(subject_of(cfg), "") << ok;
    EXPECT_EQ(cfg.queries_per_kv_head(), 8 / ok);
    EXPECT_EQ(cfg.kv_head_of(7), 7 / (8 / ok));
    EXPECT_EQ(cfg.kv_shape(), (Shape4{1, 64, ok, 16}));
  }
  for (int64_t bad : {0, -2, 3, 5, 16}) {
    cfg.kv_heads = bad;
    EXPECT_EQ(subject_of(cfg), "config.kv_heads") << bad;
  }
  cfg.kv_heads = 3;
  try {
    validate(cfg);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.kv_heads must divide config.shape.heads"),
              std::string::npos)
        << e.what();
  }
}

// Paths without grouped-query attention refuse it, naming --kv-heads, instead of reading K/V
// with the wrong layout.
TEST(ConfigValidation, BlockSparseTakesGqaWindowsAndPackedSequences) {
  AttentionConfig cfg;
  cfg.shape = {1, 256, 4, 16};
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = 64;
  cfg.kv_heads = 2;
  cfg.window_left = 8;
  cfg.cu_seqlens = {0, 100, 256};
  EXPECT_EQ(subject_of(cfg), "");
  cfg.kv_heads = 3;
  EXPECT_EQ(subject_of(cfg), "config.kv_heads");
}

TEST(ConfigValidation, RequireMultiHeadRefusesGqaNamingKvHeads) {
  AttentionConfig mha;
  mha.shape = {1, 64, 4, 16};
  EXPECT_NO_THROW(require_multi_head(mha, "x"));
  mha.kv_heads = 1;
  EXPECT_THROW(require_multi_head(mha, "x"), InputError);
}

TEST(ConfigValidation, MessageSaysWhatIsWrong) {
  try {
    validate(dilated({1, 100, 4, 16}, {32}, {1}, Combine::grouped));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the sequence length 100"),
              std::string::npos)
        << e.what();
  }
}

TEST(PatternArithmetic, GroupHeadsSplitsLikeTheReplacedProject) {
  // 5 heads over 3 groups: 2, 2, 1 (the first H % G groups get one more).
  EXPECT_EQ(group_heads(5, 3, 0).first, 0);
  EXPECT_EQ(group_heads(5, 3, 0).count, 2);
  EXPECT_EQ(group_heads(5, 3, 1).first, 2);
  EXPECT_EQ(group_heads(5, 3, 1).count, 2);
  EXPECT_EQ(group_heads(5, 3, 2).first, 4);
  EXPECT_EQ(group_heads(5, 3, 2).count, 1);
}

TEST(PatternArithmetic, SelectedPerSegmentMatchesBruteForce) {
  for (int64_t w = 1; w <= 40; ++w)
    for (int64_t r = 1; r <= 45; ++r)
      for (int64_t o = 0; o < r; ++o) {
        int64_t brute = 0;
        for (int64_t p = 0; p < w; ++p) brute += (p % r) == o;
        ASSERT_EQ(selected_per_segment({w, r}, o), brute) << w << " " << r << " " << o;
      }
}

TEST(PatternArithmetic, AttendedPairsMatchesBruteForce) {
  const Shape4 s{2, 48, 5, 8};
  for (Combine c : {Combine::grouped, Combine::mixture})
    for (bool causal : {false, true}) {
      const AttentionConfig cfg = dilated(s, {8, 16, 48}, {1, 3, 5}, c, causal);
      const auto pats = patterns_of(cfg);
      double brute = 0;
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < 3; ++i) {
          if (c == Combine::grouped) {
            const HeadRange hr = group_heads(s.heads, 3, i);
            if (h < hr.first || h >= hr.first + hr.count) continue;
          }
          const int64_t w = pats[static_cast<std::size_t>(i)].segment;
          const int64_t r = pats[static_cast<std::size_t>(i)].dilation;
          const int64_t o = pattern_offset(cfg, HeadSlice{}, i, h);
          for (int64_t p = 0; p < s.seq_len; ++p)
            for (int64_t t = 0; t < s.seq_len; ++t) {
              const bool sel = (p % w) % r == o && (t % w) % r == o && p / w == t / w;
              if (sel && (!causal || t <= p)) brute += 1;
            }
        }
      EXPECT_DOUBLE_EQ(attended_pairs(cfg), brute * static_cast<double>(s.batch));
    }
}

// A dilation past its segment is legal and selects at most one position per segment; one
// near INT64_MAX once overflowed ceil((w - o) / r) and the schedule's strides r·H·D
// (found by fuzz_segments under UBSan). It must behave as any other dilation past w.
TEST(PatternArithmetic, HugeDilationSelectsOnePositionPerSegment) {
  EXPECT_EQ(selected_per_segment({16, INT64_MAX}, 3), 1);
  EXPECT_EQ(selected_per_segment({16, INT64_MAX}, 15), 1);
  EXPECT_EQ(selected_per_segment({16, INT64_MAX}, 16), 0);
  const Shape4 s{1, 64, 6, 8};
  for (Combine c : {Combine::grouped, Combine::mixture}) {
    const AttentionConfig huge = dilated(s, {16, 64}, {INT64_MAX, 2}, c);
    const AttentionConfig large = dilated(s, {16, 64}, {1000, 2}, c);
    ASSERT_NO_THROW(validate(huge));
    EXPECT_LE(patterns_of(huge)[0].dilation, 16);  // every stride stays inside the tensor
    EXPECT_DOUBLE_EQ(attended_pairs(huge), attended_pairs(large));
  }
}

TEST(PatternArithmetic, DenseIsOneFullPattern) {
  AttentionConfig cfg;
  cfg.shape = {1, 64, 2, 8};
  ASSERT_EQ(patterns_of(cfg).size(), 1u);
  EXPECT_EQ(patterns_of(cfg)[0].segment, 64);
  EXPECT_DOUBLE_EQ(attended_pairs(cfg), 2.0 * 64 * 64);
  cfg.causal = true;
  EXPECT_DOUBLE_EQ(attended_pairs(cfg), 2.0 * 64 * 65 / 2);
}

// The grouped combine averages its head groups' outputs; a mixture merges them by lse.
TEST(PatternArithmetic, GroupedScaleIsOneOverThePatterns) {
  AttentionConfig dense;
  dense.shape = {1, 64, 2, 8};
  EXPECT_EQ(grouped_scale(dense), 1.0f);
  EXPECT_EQ(grouped_scale(dilated({1, 64, 4, 8}, {16, 64}, {1, 4}, Combine::grouped)), 0.5f);
  EXPECT_EQ(grouped_scale(dilated({1, 64, 4, 8}, {8, 16, 32, 64}, {1, 2, 4, 8}, Combine::grouped)),
            0.25f);
  EXPECT_EQ(grouped_scale(dilated({1, 64, 4, 8}, {16, 64}, {1, 4}, Combine::mixture)), 1.0f);
}

// --window L[,R]: reaches >= 0, R > 0 refused with causal, dilated refused, block-sparse
// "not yet supported"; every error names --window.
TEST(ConfigValidation, SlidingWindowReachesAndCombinations) {
  AttentionConfig cfg;
  cfg.shape = {1, 64, 4, 16};
  cfg.window_left = 0;
  EXPECT_EQ(subject_of(cfg), "");
  cfg.window_left = 1000;  // more than N: valid, the whole sequence
  cfg.window_right = 0;
  EXPECT_EQ(subject_of(cfg), "");
  EXPECT_EQ(cfg.window_reach().left, 64);
  EXPECT_EQ(cfg.window_reach().right, 0);
  cfg.window_left = -1;
  EXPECT_EQ(subject_of(cfg), "config.window_left");
  cfg.window_left = 3;
  cfg.window_right = -2;
  EXPECT_EQ(subject_of(cfg), "config.window_right");
  cfg.window_right.reset();
  EXPECT_EQ(cfg.window_reach().right, 3);  // R defaults to L
  cfg.causal = true;
  EXPECT_EQ(subject_of(cfg), "");
  EXPECT_EQ(cfg.window_reach().right, 0);  // causal: R omitted means 0
  cfg.window_right = 0;
  EXPECT_EQ(subject_of(cfg), "");
  cfg.window_right = 1;
  EXPECT_EQ(subject_of(cfg), "config.window_right");
  cfg.causal = false;
  cfg.window_left.reset();
  EXPECT_EQ(subject_of(cfg), "config.window_left");  // a right reach alone
  cfg.window_left = 2;
  cfg.attention = AttentionKind::dilated;
  cfg.segments = {32};
  cfg.dilations = {2};
  EXPECT_EQ(subject_of(cfg), "config.window_left");
  cfg.attention = AttentionKind::block_sparse;  // block-sparse takes a window
  cfg.block_size = 16;
  EXPECT_EQ(subject_of(cfg), "");
}

// Window attended pairs: every row counts the keys of [p - L, p + R] inside [0, N).
TEST(AttendedPairs, SlidingWindowCountsTheKeysInsideTheWindow) {
  for (const bool causal : {false, true})
    for (const auto& [left, right] :
         {std::pair<int64_t, int64_t>{0, 0}, {3, 1}, {1, 5}, {100, 100}}) {
      AttentionConfig cfg;
      cfg.shape = {2, 20, 3, 8};
      cfg.causal = causal;
      cfg.window_left = left;
      if (!causal) cfg.window_right = right;
      double want = 0;
      for (int64_t p = 0; p < 20; ++p)
        for (int64_t t = 0; t < 20; ++t)
          if (t >= p - left && t <= p + (causal ? 0 : right)) want += 1;
      EXPECT_DOUBLE_EQ(attended_pairs(cfg), want * 2 * 3) << left << "," << right << causal;
    }
}

}  // namespace
}  // namespace ringattn
