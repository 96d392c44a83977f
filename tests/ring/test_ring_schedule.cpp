// The ring schedule, checked for all ranks of a job inside one process: senders and
// receivers agree on every packed run, every attended (query, key) pair is computed exactly
// once somewhere, and the traffic equals the minimum computed independently (and that
// minimum equals a per-position brute-force count).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <tuple>

#include "core/patterns.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

struct Case {
  const char* name;
  AttentionConfig cfg;
};

AttentionConfig make(Shape4 s, AttentionKind a, Combine c, std::vector<int64_t> w,
                     std::vector<int64_t> r, bool causal, int64_t kv_heads = 0) {
  AttentionConfig cfg;
  cfg.shape = s;
  if (kv_heads > 0) cfg.kv_heads = kv_heads;
  cfg.attention = a;
  cfg.combine = c;
  cfg.segments = std::move(w);
  cfg.dilations = std::move(r);
  cfg.causal = causal;
  return cfg;
}

std::vector<Case> cases() {
  using A = AttentionKind;
  using C = Combine;
  std::vector<Case> v;
  for (bool causal : {false, true}) {
    v.push_back({"dense", make({2, 96, 3, 8}, A::dense, C::grouped, {}, {}, causal)});
    // segments straddling shard boundaries, shards holding several segments, both at once
    v.push_back(
        {"grouped", make({1, 96, 5, 8}, A::dilated, C::grouped, {8, 24, 96}, {1, 3, 5}, causal)});
    v.push_back(
        {"mixture", make({1, 96, 4, 8}, A::dilated, C::mixture, {12, 32, 96}, {2, 3, 4}, causal)});
    v.push_back({"bigdil", make({1, 48, 2, 8}, A::dilated, C::grouped, {16, 48}, {32, 7}, causal)});
    // grouped-query attention: MQA, a K/V head serving two patterns (grouped), query heads of
    // one K/V head with different offsets (mixture)
    v.push_back({"gqa_dense", make({2, 96, 4, 8}, A::dense, C::grouped, {}, {}, causal, 1)});
    v.push_back({"gqa_grouped",
                 make({1, 96, 6, 8}, A::dilated, C::grouped, {8, 24, 96}, {1, 3, 5}, causal, 2)});
    v.push_back({"gqa_mixture",
                 make({1, 96, 4, 8}, A::dilated, C::mixture, {12, 32, 96}, {2, 3, 4}, causal, 1)});
    v.push_back({"gqa_mixture_half",
                 make({1, 96, 6, 8}, A::dilated, C::mixture, {32, 96}, {2, 4}, causal, 3)});
    // sliding windows: within a shard, spanning shards, wider than N, asymmetric, GQA
    for (const auto& [name, left, right] : {std::tuple{"window_0", 0, 0},
                                            {"window_5", 5, 5},
                                            {"window_30_2", 30, 2},
                                            {"window_1_40", 1, 40},
                                            {"window_200", 200, 200}}) {
      AttentionConfig cfg = make({2, 96, 4, 8}, A::dense, C::grouped, {}, {}, causal, 2);
      cfg.window_left = left;
      if (!causal) cfg.window_right = right;
      v.push_back({name, cfg});
    }
    // packed documents: of length 1, inside one shard, spanning shards; with a window, GQA
    for (const auto& [name, window, kv] : {std::tuple{"packed", -1, 0},
                                           {"packed_window_4", 4, 0},
                                           {"packed_gqa_window_30", 30, 1}}) {
      AttentionConfig cfg = make({2, 96, 4, 8}, A::dense, C::grouped, {}, {}, causal, kv);
      cfg.cu_seqlens = {0, 1, 38, 40, 88, 96};
      if (window >= 0) cfg.window_left = window;
      v.push_back({name, cfg});
    }
  }
  return v;
}

bool same_document(const AttentionConfig& cfg, int64_t p, int64_t t) {
  for (std::size_t d = 0; d + 1 < cfg.cu_seqlens.size(); ++d)
    if (p >= cfg.cu_seqlens[d] && p < cfg.cu_seqlens[d + 1])
      return t >= cfg.cu_seqlens[d] && t < cfg.cu_seqlens[d + 1];
  return true;  // not packed
}

bool in_window(const AttentionConfig& cfg, int64_t p, int64_t t) {
  if (!cfg.window_left) return true;
  return p - t <= *cfg.window_left && t - p <= cfg.window_right.value_or(*cfg.window_left);
}

// Brute force: rows (position, K/V head, pattern) of `src` that some query of `dest` attends,
// through any query head reading that K/V head (h / (H / HKV)).
int64_t brute_rows(const AttentionConfig& cfg, const ShardLayout& l, int dest, int src) {
  const auto pats = patterns_of(cfg);
  const auto G = static_cast<int64_t>(pats.size());
  const int64_t H = cfg.shape.heads, HKV = cfg.kv_heads.value_or(H);
  auto owner = [&](int64_t pos) {
    for (int r = 0; r < l.world; ++r)
      for (const Chunk& c : l.chunks(r))
        if (pos >= c.begin && pos < c.begin + c.length) return r;
    return -1;
  };
  int64_t rows = 0;
  for (int64_t i = 0; i < G; ++i)
    for (int64_t kh = 0; kh < HKV; ++kh)
      for (int64_t t = 0; t < cfg.shape.seq_len; ++t) {
        if (owner(t) != src) continue;
        bool needed = false;
        for (int64_t h = 0; h < H && !needed; ++h) {
          if (h / (H / HKV) != kh) continue;
          if (cfg.combine == Combine::grouped || cfg.attention == AttentionKind::dense) {
            const HeadRange hr = group_heads(H, G, i);
            if (h < hr.first || h >= hr.first + hr.count) continue;
          }
          const int64_t w = pats[static_cast<std::size_t>(i)].segment;
          const int64_t r = pats[static_cast<std::size_t>(i)].dilation;
          const int64_t o = pattern_offset(cfg, HeadSlice{}, i, h);
          if ((t % w) % r != o) continue;
          for (int64_t p = 0; p < cfg.shape.seq_len && !needed; ++p)
            needed = owner(p) == dest && (p % w) % r == o && p / w == t / w &&
                     (!cfg.causal || t <= p) && in_window(cfg, p, t) && same_document(cfg, p, t);
        }
        rows += needed;
      }
  return rows * cfg.shape.batch;
}

class RingScheduleAllRanks : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(RingScheduleAllRanks, AgreesCoversEveryPairOnceAndMovesTheMinimum) {
  const auto& [c, world] = GetParam();
  const ShardLayout layout = make_layout(c.cfg, world);
  const kernels::TileConfig tiles{16, 32};
  std::vector<RingSchedule> s;
  for (int r = 0; r < world; ++r) s.push_back(build_ring_schedule(c.cfg, layout, r, tiles));

  double pairs = 0;
  for (int r = 0; r < world; ++r) {
    int64_t sent = 0;
    for (int t = 0; t < world; ++t) {
      const RingStep& st = s[static_cast<std::size_t>(r)].steps[static_cast<std::size_t>(t)];
      if (t > 0) {
        const int dest = (r + t) % world;
        const RingStep& peer = s[static_cast<std::size_t>(dest)].steps[static_cast<std::size_t>(t)];
        ASSERT_EQ(st.send_rows, peer.recv_rows) << "rank " << r << " step " << t;
        ASSERT_EQ(st.send_to >= 0, peer.recv_from >= 0);
        ASSERT_EQ(st.send_runs.size(), peer.recv_runs.size());
        for (std::size_t i = 0; i < st.send_runs.size(); ++i)
          ASSERT_EQ(st.send_runs[i].row0, peer.recv_runs[i].row0);
        EXPECT_EQ(st.send_rows, brute_rows(c.cfg, layout, dest, r))
            << "rank " << r << " step " << t;
        sent += st.send_rows;
      }
      for (const Wave& w : st.waves) {
        // one wave: no shared query rows; one backward range: no shared key rows (under
        // grouped-query attention the ranges split the query heads of one K/V head)
        ASSERT_FALSE(w.backward_ends.empty());
        ASSERT_EQ(w.backward_ends.back(), w.tasks.size());
        if (!c.cfg.kv_heads) {
          EXPECT_EQ(w.backward_ends.size(), 1u);
        }
        std::set<int64_t> q_rows;
        std::size_t begin = 0;
        for (const std::size_t end : w.backward_ends) {
          ASSERT_LT(begin, end);
          std::set<int64_t> k_rows;
          for (std::size_t ti = begin; ti < end; ++ti) {
            const auto& task = w.tasks[ti];
            EXPECT_TRUE(q_rows.insert(task.q_row0).second);
            EXPECT_TRUE(k_rows.insert(task.k_row0).second);
            for (int64_t i = 0; i < task.n_q; ++i)
              for (int64_t j = 0; j < task.n_k; ++j)
                pairs += (!c.cfg.causal || j <= i + task.causal_offset) &&
                         j >= i + task.causal_offset - task.window_left &&
                         j <= i + task.causal_offset + task.window_right;
          }
          begin = end;
        }
      }
    }
    const int64_t bytes = sent * 2 * c.cfg.shape.head_dim * 4;
    EXPECT_EQ(bytes, s[static_cast<std::size_t>(r)].bytes_sent);
    EXPECT_EQ(bytes, minimum_bytes_sent(c.cfg, layout, r)) << "rank " << r;
  }
  EXPECT_DOUBLE_EQ(pairs, attended_pairs(c.cfg));
}

INSTANTIATE_TEST_SUITE_P(Configs, RingScheduleAllRanks,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<0>(p.param).cfg.causal ? "_causal" : "") + "_P" +
                                  std::to_string(std::get<1>(p.param));
                         });

// Only K/V heads travel: with HKV = H / g the forward moves g times fewer bytes than
// multi-head attention of the same shape, dense and dilated.
// A window narrower than a shard: each rank exchanges only with its neighbours in position;
// the other steps move and compute nothing (no message at all), and a window of 0 moves
// nothing.
TEST(RingScheduleWindow, OnlyRanksWithinReachExchange) {
  AttentionConfig cfg = make({1, 96, 2, 8}, AttentionKind::dense, Combine::grouped, {}, {}, false);
  cfg.window_left = 5;
  const ShardLayout layout = make_layout(cfg, 4);  // 24 positions per rank, contiguous
  for (int r = 0; r < 4; ++r) {
    const RingSchedule s = build_ring_schedule(cfg, layout, r, {16, 32});
    for (int t = 1; t < 4; ++t) {
      const RingStep& st = s.steps[static_cast<std::size_t>(t)];
      const int dest = (r + t) % 4, src = (r - t + 4) % 4;
      EXPECT_EQ(st.send_to >= 0, std::abs(dest - r) == 1) << r << " step " << t;
      EXPECT_EQ(st.recv_from >= 0, std::abs(src - r) == 1) << r << " step " << t;
      if (st.send_to >= 0) {
        EXPECT_EQ(st.send_rows, 5 * 2);  // 5 positions, 2 K/V heads
      }
      if (st.recv_from < 0) {
        EXPECT_TRUE(st.waves.empty());
      }
    }
  }
  cfg.window_left = 0;
  for (int r = 0; r < 4; ++r) {
    const RingSchedule s = build_ring_schedule(cfg, layout, r, {16, 32});
    EXPECT_EQ(s.bytes_sent, 0);
    for (int t = 1; t < 4; ++t) EXPECT_EQ(s.steps[static_cast<std::size_t>(t)].send_to, -1);
  }
}

// Both ring engines add returned dK/dV rows in parallel unless a step's runs repeat a row.
// A K/V head that head groups of two patterns share (grouped GQA) repeats rows, as a mixture
// does; a lent H100 found the GPU's parallel add racing there (dK/dV off by up to 15 %) when
// only the mixture was sent to the serial add.
TEST(RingScheduleGqa, StepsWhoseRunsRepeatARowAreFound) {
  auto any_step_repeats = [](const AttentionConfig& cfg, int world) {
    const ShardLayout layout = make_layout(cfg, world);
    for (int r = 0; r < world; ++r)
      for (const RingStep& st : build_ring_schedule(cfg, layout, r, {16, 32}).steps)
        if (runs_repeat_a_row(st.send_runs)) return true;
    return false;
  };
  // 3 pattern groups of 2 heads over 2 K/V heads of 3: K/V head 0 serves two patterns.
  AttentionConfig straddling =
      make({1, 240, 6, 16}, AttentionKind::dilated, Combine::grouped, {16, 48, 240}, {1, 3, 7},
           false);
  straddling.kv_heads = 2;
  AttentionConfig mixture = straddling;
  mixture.combine = Combine::mixture;
  mixture.kv_heads = 6;
  AttentionConfig grouped = straddling;  // one K/V head per query head: no sharing
  grouped.kv_heads = 6;
  AttentionConfig dense = make({1, 240, 6, 16}, AttentionKind::dense, Combine::grouped, {}, {}, true);
  dense.kv_heads = 2;
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(any_step_repeats(straddling, world)) << world;
    EXPECT_TRUE(any_step_repeats(mixture, world)) << world;
    EXPECT_FALSE(any_step_repeats(grouped, world)) << world;
    EXPECT_FALSE(any_step_repeats(dense, world)) << world;
  }
  EXPECT_FALSE(runs_repeat_a_row({}));
}

// The one answer both ring engines ask before adding returned dK/dV rows in parallel: rows
// are element offsets row0 + i·stride, whatever the runs' patterns or heads say.
TEST(RingScheduleGqa, RunsRepeatARowWhenTwoOffsetsMeet) {
  auto run = [](int64_t row0, int64_t stride, int64_t rows) {
    ring::Run r;  // (a bare Run is gtest's Test::Run here)
    r.row0 = row0;
    r.stride = stride;
    r.k_end = rows;
    return r;
  };
  // Interleaved strides: 0, 64, 128 and 32, 96, 160 never meet.
  EXPECT_FALSE(runs_repeat_a_row({run(0, 64, 3), run(32, 64, 3)}));
  // A second pattern's run through 128 meets the first's third row.
  EXPECT_TRUE(runs_repeat_a_row({run(0, 64, 3), run(128, 192, 2)}));
  // Within one run rows are distinct; a run of no rows names none.
  EXPECT_FALSE(runs_repeat_a_row({run(0, 16, 8), run(0, 16, 0)}));
  EXPECT_TRUE(runs_repeat_a_row({run(0, 16, 8), run(112, 16, 1)}));
}

TEST(RingScheduleGqa, KvHeadsMoveHOverHkvTimesFewerBytes) {
  for (bool dilated : {false, true})
    for (bool causal : {false, true})
      for (int world : {2, 3, 4}) {
        AttentionConfig mha =
            make({2, 96, 8, 16}, dilated ? AttentionKind::dilated : AttentionKind::dense,
                 Combine::grouped, {}, {}, causal);
        if (dilated) {
          mha.segments = {48, 96};
          mha.dilations = {1, 2};
        }
        const ShardLayout layout = make_layout(mha, world);
        for (int64_t kv : {1, 2, 4}) {
          AttentionConfig gqa = mha;
          gqa.kv_heads = kv;
          for (int r = 0; r < world; ++r) {
            const int64_t full = build_ring_schedule(mha, layout, r, {16, 32}).bytes_sent;
            const int64_t grouped = build_ring_schedule(gqa, layout, r, {16, 32}).bytes_sent;
            EXPECT_GT(full, 0);
            if (!dilated) {
              // dense: every query head needs every key of its K/V head
              EXPECT_EQ(grouped * (8 / kv), full) << "kv " << kv << " P " << world;
            } else {
              EXPECT_LT(grouped, full) << "kv " << kv << " P " << world;
            }
            EXPECT_EQ(grouped, minimum_bytes_sent(gqa, layout, r));
          }
        }
      }
}

TEST(Sharding, ZigzagBalancesCausalWork) {
  AttentionConfig cfg;
  cfg.shape = {1, 4096, 1, 8};
  cfg.causal = true;
  const ShardLayout l = make_layout(cfg, 4);
  const kernels::TileConfig tiles{128, 256};
  std::vector<double> work;
  for (int r = 0; r < 4; ++r) {
    const RingSchedule s = build_ring_schedule(cfg, l, r, tiles);
    double pairs = 0;
    for (const auto& st : s.steps)
      for (const auto& w : st.waves)
        for (const auto& t : w.tasks)
          for (int64_t i = 0; i < t.n_q; ++i)
            pairs += static_cast<double>(std::clamp<int64_t>(i + t.causal_offset + 1, 0, t.n_k));
    work.push_back(pairs);
  }
  const double mx = *std::max_element(work.begin(), work.end());
  double mean = 0;
  for (double w : work) mean += w / 4;
  EXPECT_LE(mx / mean, 1.01);
}

TEST(Sharding, UnevenSplitIsAnInputErrorNamingSeqLen) {
  AttentionConfig cfg;
  cfg.shape = {1, 100, 1, 8};
  try {
    make_layout(cfg, 3);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.subject(), "config.shape.seq_len");
  }
  // Causal runs need only N % P == 0: where 2P does not divide N the layout is balanced.
  cfg.causal = true;
  const ShardLayout l = make_layout(cfg, 4);
  EXPECT_STREQ(l.name(), "balanced");
  EXPECT_STREQ(make_layout(cfg, 2).name(), "zigzag");
  EXPECT_THROW(make_layout(cfg, 3), InputError);
}

// Documents of lengths drawn log-uniform from [lo, hi] (the last one cut to fit), N total.
std::vector<int64_t> log_uniform_documents(int64_t n, int64_t lo, int64_t hi, uint64_t seed) {
  std::vector<int64_t> cu{0};
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  while (cu.back() < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;
    const auto len = static_cast<int64_t>(
        std::exp(std::log(static_cast<double>(lo)) +
                 u * (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo)))));
    cu.push_back(std::min(n, cu.back() + std::max<int64_t>(1, len)));
  }
  return cu;
}

// Every position on exactly one rank, N/P rows each, chunks ascending and packed back to back.
void expect_partition(const ShardLayout& l) {
  std::vector<int> owner(static_cast<std::size_t>(l.seq_len), -1);
  for (int r = 0; r < l.world; ++r) {
    int64_t rows = 0, last_end = -1;
    for (const Chunk& c : l.chunks(r)) {
      EXPECT_EQ(c.local_begin, rows);
      EXPECT_GE(c.begin, last_end);
      EXPECT_GT(c.length, 0);
      last_end = c.begin + c.length;
      rows += c.length;
      for (int64_t p = c.begin; p < c.begin + c.length; ++p) {
        EXPECT_EQ(owner[static_cast<std::size_t>(p)], -1) << p;
        owner[static_cast<std::size_t>(p)] = r;
      }
    }
    EXPECT_EQ(rows, l.local_len) << "rank " << r;
  }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
}

// Causal packed runs of realistic mixes (64K tokens, lengths log-uniform in 128..16K): the
// balanced layout keeps every rank within 1.1 of the mean attended pairs, where the zigzag
// layout of the same run is far out.
TEST(Sharding, BalancedLayoutKeepsCausalPackedMixesWithin1Point1) {
  for (uint64_t seed = 1; seed <= 6; ++seed)
    for (int world : {2, 4, 8}) {
      AttentionConfig cfg;
      cfg.shape = {1, 65536, 1, 64};
      cfg.causal = true;
      cfg.cu_seqlens = log_uniform_documents(65536, 128, 16384, seed);
      const ShardLayout l = make_layout(cfg, world);
      expect_partition(l);
      const double balanced = imbalance(attended_pairs_by_rank(cfg, l));
      ShardLayout zigzag = l;
      zigzag.balanced.clear();
      zigzag.zigzag = true;
      const double usual = imbalance(attended_pairs_by_rank(cfg, zigzag));
      EXPECT_LE(balanced, 1.1) << "seed " << seed << " P=" << world << " (" << l.name()
                               << "; zigzag " << usual << ")";
      EXPECT_LE(balanced, usual) << "seed " << seed << " P=" << world;
    }
}

// Any N divisible by P: the layouts partition the sequence; one causal document with
// N % 2P != 0 is still balanced.
TEST(Sharding, LayoutsPartitionTheSequenceForAnyNDivisibleByP) {
  for (const int64_t n : {12, 60, 252, 1000})
    for (int world : {1, 2, 3, 4}) {
      if (n % world != 0) continue;
      for (bool causal : {false, true})
        for (bool packed : {false, true}) {
          AttentionConfig cfg;
          cfg.shape = {1, n, 2, 8};
          cfg.causal = causal;
          if (packed) cfg.cu_seqlens = log_uniform_documents(n, 1, n / 2 + 1, 7);
          const ShardLayout l = make_layout(cfg, world);
          SCOPED_TRACE(std::to_string(n) + " P" + std::to_string(world) + l.name());
          expect_partition(l);
          if (causal && !packed && n >= 64 * world) {
            EXPECT_LE(imbalance(attended_pairs_by_rank(cfg, l)), 1.1);
          }
        }
    }
}

}  // namespace
}  // namespace ringattn::ring
