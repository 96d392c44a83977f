// Shard layouts (contiguous, zigzag or balanced) and the copies between full and local tensors.
#include "ring/sharding.hpp"

#include <algorithm>
#include <string>

#include "core/patterns.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {

std::vector<Chunk> ShardLayout::chunks(int rank) const {
  if (!balanced.empty()) return balanced[static_cast<std::size_t>(rank)];
  if (!zigzag) return {{rank * local_len, local_len, 0}};
  const int64_t c = local_len / 2;
  return {{rank * c, c, 0}, {(2 * world - 1 - rank) * c, c, c}};
}

const char* ShardLayout::name() const {
  return !balanced.empty() ? "balanced" : (zigzag ? "zigzag" : "contiguous");
}

int64_t ShardLayout::global_position(int rank, int64_t row) const {
  for (const Chunk& ch : chunks(rank))
    if (row >= ch.local_begin && row < ch.local_begin + ch.length)
      return ch.begin + (row - ch.local_begin);
  return -1;
}

namespace {

// Attended pairs of each query position, summed over heads (one batch row).
std::vector<double> position_work(const AttentionConfig& cfg, const HeadSlice& slice) {
  const int64_t n = cfg.shape.seq_len;
  std::vector<double> work(static_cast<std::size_t>(n), 0.0);
  if (cfg.attention == AttentionKind::dense) {
    const auto heads = static_cast<double>(cfg.shape.heads);
    for (int64_t p = 0; p < n; ++p) {
      const PositionRange keys = dense_keys_of(cfg, p);
      work[static_cast<std::size_t>(p)] = heads * static_cast<double>(keys.end - keys.begin);
    }
    return work;
  }
  const auto pats = patterns_of(cfg);
  const auto n_patterns = static_cast<int64_t>(pats.size());
  const bool mixture = cfg.combine == Combine::mixture;
  for (int64_t h = 0; h < cfg.shape.heads; ++h)
    for (int64_t i = 0; i < n_patterns; ++i) {
      const HeadRange g = group_heads_of(cfg, slice, n_patterns, i);
      if (!mixture && (h < g.first || h >= g.first + g.count)) continue;
      const DilatedPattern& pat = pats[static_cast<std::size_t>(i)];
      const int64_t o = pattern_offset(cfg, slice, i, h);
      const SegmentList segs = segments_of(cfg, pat);
      for (int64_t seg = 0; seg < segs.count(); ++seg) {
        const int64_t m = selected_in(segs.length(seg), pat, o);
        for (int64_t idx = 0; idx < m; ++idx)
          work[static_cast<std::size_t>(segs.begin(seg) + o + idx * pat.dilation)] +=
              static_cast<double>(cfg.causal ? idx + 1 : m);
      }
    }
  return work;
}

std::vector<double> work_by_rank(const ShardLayout& l, const std::vector<double>& work) {
  std::vector<double> prefix(work.size() + 1, 0.0);
  for (std::size_t p = 0; p < work.size(); ++p) prefix[p + 1] = prefix[p] + work[p];
  std::vector<double> by_rank(static_cast<std::size_t>(l.world), 0.0);
  for (int r = 0; r < l.world; ++r)
    for (const Chunk& c : l.chunks(r))
      by_rank[static_cast<std::size_t>(r)] += prefix[static_cast<std::size_t>(c.begin + c.length)] -
                                              prefix[static_cast<std::size_t>(c.begin)];
  return by_rank;
}

// Band counts tried (fewest first: fewer, longer chunks mean fewer messages and fuller
// tiles); pieces are kept at least kMinPieceRows long. The first within kGoodEnough of the
// mean is taken, else the best.
constexpr int64_t kMaxBands = 64;
constexpr int64_t kMinPieceRows = 32;
constexpr double kGoodEnough = 1.03;

// Cuts the sequence into bands of P equal pieces (band j's pieces hold s_j rows, the s_j
// summing to N/P) and deals each band's pieces to distinct ranks: bands in order of their
// heaviest piece, each band's pieces heaviest first to the ranks least loaded so far. Every
// rank gets one piece per band, so exactly N/P rows. A single causal document gives the
// zigzag layout; mixed documents stay within a piece's work of the mean.
std::vector<std::vector<Chunk>> deal_pieces(int world, int64_t local_len,
                                            const std::vector<double>& work, int64_t bands) {
  std::vector<double> prefix(work.size() + 1, 0.0);
  for (std::size_t p = 0; p < work.size(); ++p) prefix[p + 1] = prefix[p] + work[p];
  bands = std::min(bands, local_len);
  struct Band {
    int64_t begin = 0, rows = 0;  // first position, rows per piece
    double heaviest = 0;
  };
  std::vector<Band> band_list;
  int64_t pos = 0;
  for (int64_t j = 0; j < bands; ++j) {
    Band b{pos, local_len / bands + (j < local_len % bands ? 1 : 0), 0.0};
    for (int q = 0; q < world; ++q) {
      const int64_t x = b.begin + q * b.rows;
      b.heaviest = std::max(b.heaviest, prefix[static_cast<std::size_t>(x + b.rows)] -
                                            prefix[static_cast<std::size_t>(x)]);
    }
    pos += b.rows * world;
    band_list.push_back(b);
  }
  std::stable_sort(band_list.begin(), band_list.end(),
                   [](const Band& a, const Band& b) { return a.heaviest > b.heaviest; });
  std::vector<double> load(static_cast<std::size_t>(world), 0.0);
  std::vector<std::vector<Chunk>> chunks(static_cast<std::size_t>(world));
  std::vector<int> pieces(static_cast<std::size_t>(world)), ranks(static_cast<std::size_t>(world));
  for (const Band& b : band_list) {
    auto piece_work = [&](int q) {
      const int64_t x = b.begin + q * b.rows;
      return prefix[static_cast<std::size_t>(x + b.rows)] - prefix[static_cast<std::size_t>(x)];
    };
    for (int i = 0; i < world; ++i)
      pieces[static_cast<std::size_t>(i)] = ranks[static_cast<std::size_t>(i)] = i;
    std::stable_sort(pieces.begin(), pieces.end(),
                     [&](int a, int c) { return piece_work(a) > piece_work(c); });
    std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int c) {
      return load[static_cast<std::size_t>(a)] < load[static_cast<std::size_t>(c)];
    });
    for (int i = 0; i < world; ++i) {
      const int q = pieces[static_cast<std::size_t>(i)], r = ranks[static_cast<std::size_t>(i)];
      load[static_cast<std::size_t>(r)] += piece_work(q);
      chunks[static_cast<std::size_t>(r)].push_back({b.begin + q * b.rows, b.rows, 0});
    }
  }
  for (auto& list : chunks) {
    std::sort(list.begin(), list.end(),
              [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
    std::vector<Chunk> merged;
    for (const Chunk& c : list) {
      if (!merged.empty() && merged.back().begin + merged.back().length == c.begin)
        merged.back().length += c.length;
      else
        merged.push_back(c);
    }
    int64_t row = 0;
    for (Chunk& c : merged) {
      c.local_begin = row;
      row += c.length;
    }
    list = std::move(merged);
  }
  return chunks;
}

// The usual layout is kept for packed runs whose work it splits within this of the mean.
constexpr double kUsualLayoutTolerance = 1.05;

}  // namespace

double imbalance(const std::vector<double>& pairs_by_rank) {
  double total = 0, most = 0;
  for (double x : pairs_by_rank) {
    total += x;
    most = std::max(most, x);
  }
  if (total <= 0) return 1.0;
  return most / (total / static_cast<double>(pairs_by_rank.size()));
}

std::vector<double> attended_pairs_by_rank(const AttentionConfig& cfg, const ShardLayout& l) {
  auto by_rank = work_by_rank(l, position_work(cfg, HeadSlice{}));
  for (double& x : by_rank) x *= static_cast<double>(cfg.shape.batch);
  return by_rank;
}

ShardLayout make_layout(const AttentionConfig& cfg, int world, const HeadSlice& slice) {
  if (world < 1) throw InputError("ranks", "world size must be at least 1");
  ShardLayout l;
  l.world = world;
  l.seq_len = cfg.shape.seq_len;
  if (l.seq_len % world != 0)
    throw InputError("config.shape.seq_len",
                     std::to_string(l.seq_len) + " tokens cannot be split evenly over " +
                         std::to_string(world) +
                         " ranks (N must be divisible by the number of ranks)");
  l.local_len = l.seq_len / world;
  if (world == 1) return l;
  const bool zigzag_fits = l.seq_len % (2 * static_cast<int64_t>(world)) == 0;
  l.zigzag = cfg.causal && zigzag_fits;
  const bool usual_fits = !cfg.causal || zigzag_fits;
  if (usual_fits && !cfg.packed()) return l;
  const auto work = position_work(cfg, slice);
  const double usual = usual_fits ? imbalance(work_by_rank(l, work)) : 0.0;
  if (usual_fits && usual <= kUsualLayoutTolerance) return l;
  ShardLayout best = l;
  double best_imbalance = usual_fits ? usual : 0.0;
  for (int64_t bands = 2; bands <= kMaxBands; bands *= 2) {
    if (bands > 2 && l.local_len / bands < kMinPieceRows) break;
    ShardLayout candidate = l;
    candidate.zigzag = false;
    candidate.balanced = deal_pieces(world, l.local_len, work, bands);
    const double x = imbalance(work_by_rank(candidate, work));
    // The usual layout wins ties; a balanced one must beat it.
    if (best_imbalance == 0.0 || x < best_imbalance) {
      best = std::move(candidate);
      best_imbalance = x;
    }
    if (best_imbalance <= kGoodEnough) break;
  }
  return best;
}

void extract_rows(const ShardLayout& l, int rank, int64_t batch, int64_t inner, const float* full,
                  float* local) {
  for (int64_t b = 0; b < batch; ++b)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(full + (b * l.seq_len + c.begin) * inner, c.length * inner,
                  local + (b * l.local_len + c.local_begin) * inner);
}

void insert_rows(const ShardLayout& l, int rank, int64_t batch, int64_t inner, const float* local,
                 float* full) {
  for (int64_t b = 0; b < batch; ++b)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(local + (b * l.local_len + c.local_begin) * inner, c.length * inner,
                  full + (b * l.seq_len + c.begin) * inner);
}

void insert_lse(const ShardLayout& l, int rank, int64_t batch, int64_t heads, const float* local,
                float* full) {
  for (int64_t bh = 0; bh < batch * heads; ++bh)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(local + bh * l.local_len + c.local_begin, c.length,
                  full + bh * l.seq_len + c.begin);
}

}  // namespace ringattn::ring
