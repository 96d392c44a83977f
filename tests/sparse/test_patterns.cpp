// Each pattern generator against a brute-force evaluation of its definition
// (docs/SEMANTICS.md), the `--pattern` language and its errors, the conversions between
// masks and lists, and the pattern cache (sharing, LRU bound, one build under concurrency).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <set>
#include <thread>

#include "ringattn/errors.hpp"
#include "sparse/block_lists.hpp"
#include "sparse/pattern.hpp"
#include "sparse/pattern_cache.hpp"

namespace ringattn::sparse {
namespace {

using Rule = std::function<bool(int64_t h, int64_t i, int64_t j)>;

BlockLists lists_for(const std::string& text, const Geometry& g,
                     const std::vector<int64_t>& w = {}, const std::vector<int64_t>& r = {}) {
  return build_lists(parse_pattern(text, g, w, r, 0), g);
}

// Every (head, query block, key block) agrees with the rule.
void expect_matches(const BlockLists& l, const Rule& rule, const std::string& what) {
  for (int64_t h = 0; h < l.heads; ++h)
    for (int64_t i = 0; i < l.blocks; ++i) {
      std::set<int64_t> got(l.of_head(h).row(i).begin(), l.of_head(h).row(i).end());
      for (int64_t j = 0; j < l.blocks; ++j)
        ASSERT_EQ(got.count(j) == 1, rule(h, i, j))
            << what << ": head " << h << " query block " << i << " key block " << j;
    }
}

const Geometry kGeoms[] = {{256, 16, 3}, {512, 32, 4}, {96, 8, 2}, {64, 64, 1}};

TEST(Patterns, LocalIsAWindowInWholeBlocks) {
  for (const Geometry& g : kGeoms)
    for (int64_t window : {1, 16, 47, 96, 130, 1000}) {
      const int64_t radius = window / (2 * g.block_size);
      expect_matches(lists_for("local:window=" + std::to_string(window), g),
                     [&](int64_t, int64_t i, int64_t j) { return std::abs(i - j) <= radius; },
                     "local " + std::to_string(window));
    }
}

TEST(Patterns, GlobalBlocksSeeAndAreSeenByAll) {
  for (const Geometry& g : kGeoms)
    for (int64_t n : {int64_t{1}, int64_t{2}, g.blocks()}) {
      if (n > g.blocks()) continue;
      expect_matches(lists_for("global:blocks=" + std::to_string(n), g),
                     [&](int64_t, int64_t i, int64_t j) { return i < n || j < n; }, "global");
    }
}

TEST(Patterns, StridedEverySthBlock) {
  for (const Geometry& g : kGeoms)
    for (int64_t s : {int64_t{1}, int64_t{2}, int64_t{3}, g.blocks()}) {
      if (s > g.blocks()) continue;
      expect_matches(lists_for("strided:stride=" + std::to_string(s), g),
                     [&](int64_t, int64_t i, int64_t j) { return ((i - j) % s + s) % s == 0; },
                     "strided");
    }
}

TEST(Patterns, DilatedBlocksFollowLongNetPerHead) {
  const Geometry g{512, 16, 5};
  const std::vector<int64_t> w{64, 128, 512}, r{1, 2, 4};
  const Rule rule = [&](int64_t h, int64_t i, int64_t j) {
    for (std::size_t k = 0; k < w.size(); ++k) {
      const int64_t seg = w[k] / g.block_size, o = h % r[k];
      if (i / seg == j / seg && (i % seg) % r[k] == o && (j % seg) % r[k] == o) return true;
    }
    return false;
  };
  expect_matches(lists_for("dilated-blocks", g, w, r), rule, "dilated-blocks from options");
  expect_matches(lists_for("dilated-blocks:segments=64/128/512,dilations=1/2/4", g), rule,
                 "dilated-blocks from parameters");
  // Heads with the same offsets share one list: offsets repeat with lcm(1, 2, 4) = 4.
  const BlockLists l = lists_for("dilated-blocks", g, w, r);
  EXPECT_EQ(l.lists.size(), 4u);
  EXPECT_EQ(l.head_list[0], l.head_list[4]);
}

// Many patterns with large dilations: the head classes once overflowed int64 (a number
// built from the offsets in base r), which UBSan reports and which could merge heads.
TEST(Patterns, DilatedBlocksWithManyPatternsKeepHeadsApart) {
  const Geometry g{48, 1, 50};
  std::vector<int64_t> w(14, 48), r(14, 47);
  r[0] = 2;  // lcm 94: heads 0..49 are all different, and so are their lists
  const Rule rule = [&](int64_t h, int64_t i, int64_t j) {
    for (std::size_t k = 0; k < w.size(); ++k)
      if ((i % w[k]) % r[k] == h % r[k] && (j % w[k]) % r[k] == h % r[k]) return true;
    return false;
  };
  const BlockLists l = lists_for("dilated-blocks", g, w, r);
  expect_matches(l, rule, "14 dilated-blocks patterns");
  EXPECT_EQ(l.lists.size(), 50u);
}

TEST(Patterns, RandomIsSeededDistinctAndPerHead) {
  const Geometry g{1024, 16, 3};
  const BlockLists a = lists_for("random:blocks=5,seed=11", g);
  const BlockLists b = lists_for("random:blocks=5,seed=11", g);
  const BlockLists c = lists_for("random:blocks=5,seed=12", g);
  EXPECT_EQ(a.lists.size(), 3u);  // one list per head
  for (int64_t h = 0; h < g.heads; ++h) {
    EXPECT_EQ(a.of_head(h).cols, b.of_head(h).cols) << "same seed, same lists";
    EXPECT_NE(a.of_head(h).cols, c.of_head(h).cols) << "another seed, other lists";
    for (int64_t i = 0; i < g.blocks(); ++i) {
      const auto row = a.of_head(h).row(i);
      EXPECT_EQ(row.size(), 5u);  // distinct (lists are unique per row)
      for (int32_t j : row) EXPECT_TRUE(j >= 0 && j < g.blocks());
    }
  }
  EXPECT_NE(a.of_head(0).cols, a.of_head(1).cols);
  // Asking for every block gives every block.
  const BlockLists all = lists_for("random:blocks=64", g);
  EXPECT_EQ(all.of_head(0).nnz(), 64 * 64);
  // Roughly uniform: every key block is drawn about 5 times per head over 64 rows.
  std::vector<int> hits(64, 0);
  for (int32_t j : a.of_head(0).cols) ++hits[static_cast<std::size_t>(j)];
  for (int n : hits) EXPECT_LT(n, 20);
}

TEST(Patterns, UnionsAndBigbird) {
  const Geometry g{1024, 32, 2};
  const BlockLists u = lists_for("local:window=96+global:blocks=2+random:blocks=3,seed=5", g);
  const BlockLists bb = lists_for("bigbird:window=96,global=2,random=3,seed=5", g);
  const BlockLists r = lists_for("random:blocks=3,seed=5", g);
  for (int64_t h = 0; h < g.heads; ++h) {
    EXPECT_EQ(u.of_head(h).cols, bb.of_head(h).cols);
    for (int64_t i = 0; i < g.blocks(); ++i) {
      std::set<int64_t> want;
      for (int64_t j = 0; j < g.blocks(); ++j)
        if (std::abs(i - j) <= 1 || i < 2 || j < 2) want.insert(j);
      for (int32_t j : r.of_head(h).row(i)) want.insert(j);
      const auto row = u.of_head(h).row(i);
      EXPECT_EQ(std::set<int64_t>(row.begin(), row.end()), want) << "row " << i;
    }
  }
  // Canonical text is order-independent (it is the cache key).
  EXPECT_EQ(parse_pattern("global+local", g, {}, {}, 0).canonical,
            parse_pattern("local+global", g, {}, {}, 0).canonical);
}

// The canonical form spells every parameter out, defaults included; it must parse back to
// itself even where a default exceeds a short sequence's blocks (fuzz_pattern found
// "bigbird" on one block describing itself as global:blocks=2, which is refused).
TEST(Patterns, CanonicalFormParsesBackOnShortSequences) {
  for (const Geometry& g : {Geometry{16, 16, 2}, Geometry{32, 16, 2}, Geometry{256, 16, 3}})
    for (const char* text : {"bigbird", "random", "global", "strided", "local"}) {
      const Pattern p = parse_pattern(text, g, {}, {}, 3);
      Pattern again;
      ASSERT_NO_THROW(again = parse_pattern(p.canonical, g, {}, {}, 4))
          << text << " on " << g.blocks() << " blocks: " << p.canonical;
      EXPECT_EQ(again.canonical, p.canonical);
    }
}

TEST(Patterns, BadTextIsAnInputErrorNamingPattern) {
  const Geometry g{1024, 32, 2};
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "empty"},
      {"nope", "unknown pattern 'nope'"},
      {"local+", "empty term"},
      {"local:width=3", "unknown parameter 'width'"},
      {"local:window=abc", "not an integer"},
      {"local:window=0", "out of range"},
      {"global:blocks=33", "out of range"},
      {"random:blocks=0", "out of range"},
      {"strided:stride=-1", "out of range"},
      {"local:window", "not key=value"},
      {"local:window=3,window=4", "given twice"},
      {"dilated-blocks", "needs segments"},
      {"dilated-blocks:segments=48,dilations=1", "multiple of the block size"},
      {"dilated-blocks:segments=64/128,dilations=1", "must pair up"},
      {"dilated-blocks:segments=64,dilations=3", "dilation 3 must be in 1..2"},
  };
  for (const auto& [text, why] : bad) {
    try {
      parse_pattern(text, g, {}, {}, 0);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "block_sparse.pattern") << text;
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(BlockLists, MaskRoundTripTransposeAndCounts) {
  const Geometry g{256, 16, 3};
  const BlockLists l = lists_for("local:window=48+random:blocks=2,seed=3", g);
  const std::vector<uint8_t> mask = mask_from_lists(l);
  const BlockLists back = lists_from_mask(mask.data(), g.heads, g.heads, g.blocks(), 16);
  for (int64_t h = 0; h < g.heads; ++h) EXPECT_EQ(back.of_head(h).cols, l.of_head(h).cols);
  // A shared [nb, nb] mask gives one list for every head.
  const BlockLists shared = lists_from_mask(mask.data(), 1, 4, g.blocks(), 16);
  EXPECT_EQ(shared.lists.size(), 1u);
  const BlockCsr t = transpose(l.of_head(0), g.blocks());
  int64_t pairs = 0, causal_pairs = 0;
  for (int64_t i = 0; i < g.blocks(); ++i)
    for (int64_t j = 0; j < g.blocks(); ++j) {
      const bool m = mask[static_cast<std::size_t>(i * g.blocks() + j)];
      const auto col = t.row(j);
      EXPECT_EQ(m, std::find(col.begin(), col.end(), i) != col.end());
    }
  for (int64_t h = 0; h < g.heads; ++h)
    for (int64_t i = 0; i < g.blocks(); ++i)
      for (int64_t j = 0; j < g.blocks(); ++j)
        if (mask[static_cast<std::size_t>((h * g.blocks() + i) * g.blocks() + j)]) {
          ++pairs;
          causal_pairs += j <= i;
        }
  EXPECT_EQ(computed_block_pairs(l, false), pairs);
  EXPECT_EQ(computed_block_pairs(l, true), causal_pairs);
  EXPECT_DOUBLE_EQ(sparsity(l, false), 1.0 - static_cast<double>(pairs) / (3.0 * 16 * 16));
  EXPECT_DOUBLE_EQ(sparsity(l, true), 1.0 - static_cast<double>(causal_pairs) / (3.0 * 16 * 17 / 2));
}

TEST(PatternCache, SharesEvictsAndBuildsOnce) {
  PatternCache cache(2);
  std::atomic<int> builds{0};
  auto build = [&] {
    ++builds;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return lists_for("local", Geometry{256, 16, 2});
  };
  std::vector<std::thread> threads;
  std::vector<PatternCache::Lists> got(8);
  for (std::size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] { got[i] = cache.get("a", build); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(builds.load(), 1) << "concurrent requests for one key build it once";
  for (const auto& p : got) EXPECT_EQ(p.get(), got[0].get());
  cache.get("b", build);
  cache.get("a", build);  // a is now the most recent
  cache.get("c", build);  // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(builds.load(), 3);
  cache.get("a", build);
  EXPECT_EQ(builds.load(), 3) << "a stayed";
  cache.get("b", build);
  EXPECT_EQ(builds.load(), 4) << "b was evicted";
  // A failing build is not cached and reaches the caller.
  EXPECT_THROW(cache.get("bad", []() -> BlockLists { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_THROW(cache.get("bad", []() -> BlockLists { throw std::runtime_error("y"); }),
               std::runtime_error);
  EXPECT_EQ(got[0].use_count() > 0, true);  // evicted entries stay alive for their holders
}

}  // namespace
}  // namespace ringattn::sparse
