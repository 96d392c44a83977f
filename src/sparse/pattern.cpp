// The `--pattern` language and the union of generators into per-head block lists.
#include "sparse/pattern.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"

namespace ringattn::sparse {

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string item;
  std::stringstream ss(text);
  while (std::getline(ss, item, sep)) parts.push_back(item);
  if (!text.empty() && text.back() == sep) parts.push_back("");
  return parts;
}

int64_t parse_int(const std::string& term, const std::string& key, const std::string& value) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size())
    throw InputError("block_sparse.pattern",
                     quote(term) + ": " + escaped(key) + "=" + quote(value) + " is not an integer");
  return v;
}

std::vector<int64_t> parse_list(const std::string& term, const std::string& key,
                                const std::string& value) {
  std::vector<int64_t> out;
  for (const std::string& item : split(value, '/')) out.push_back(parse_int(term, key, item));
  return out;
}

// A term's `key=value` parameters, each used at most once; leftovers are errors.
class Params {
 public:
  Params(const std::string& term, const std::string& text) : term_(term) {
    if (text.empty()) return;
    for (const std::string& kv : split(text, ',')) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InputError("block_sparse.pattern",
                         quote(term) + ": parameter " + quote(kv) + " is not key=value");
      const std::string key = kv.substr(0, eq);
      if (!values_.emplace(key, kv.substr(eq + 1)).second)
        throw InputError("block_sparse.pattern",
                         quote(term) + ": parameter " + quote(key) + " given twice");
    }
  }
  int64_t get(const std::string& key, int64_t fallback, int64_t lo, int64_t hi,
              const std::string& why) {
    const auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    const int64_t v = parse_int(term_, key, it->second);
    values_.erase(it);
    if (v < lo || v > hi)
      throw InputError("block_sparse.pattern", quote(term_) + ": " + escaped(key) + "=" +
                                                   std::to_string(v) + " is out of range " +
                                                   std::to_string(lo) + ".." + std::to_string(hi) +
                                                   " (" + why + ")");
    return v;
  }
  std::vector<int64_t> list(const std::string& key, const std::vector<int64_t>& fallback) {
    const auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    auto v = parse_list(term_, key, it->second);
    values_.erase(it);
    return v;
  }
  void finish(const std::string& allowed) const {
    if (!values_.empty())
      throw InputError("block_sparse.pattern", quote(term_) + ": unknown parameter " +
                                                   quote(values_.begin()->first) +
                                                   " (allowed: " + allowed + ")");
  }

 private:
  std::string term_;
  std::map<std::string, std::string> values_;
};

void check_dilated(const std::string& term, const Geometry& g, const std::vector<int64_t>& w,
                   const std::vector<int64_t>& r) {
  if (w.empty() || r.empty())
    throw InputError("block_sparse.pattern", quote(term) +
                                                 " needs segments and dilations "
                                                 "(config.segments and config.dilations, or "
                                                 "segments=a/b,dilations=x/y)");
  if (w.size() != r.size())
    throw InputError("block_sparse.pattern", quote(term) + ": " + std::to_string(w.size()) +
                                                 " segments but " + std::to_string(r.size()) +
                                                 " dilations; they must pair up");
  for (std::size_t k = 0; k < w.size(); ++k) {
    if (w[k] <= 0 || w[k] % g.block_size != 0 || g.seq_len % w[k] != 0)
      throw InputError("block_sparse.pattern",
                       quote(term) + ": segment " + std::to_string(w[k]) +
                           " must be a positive multiple of the block size " +
                           std::to_string(g.block_size) + " that divides the sequence length " +
                           std::to_string(g.seq_len));
    if (r[k] <= 0 || r[k] > w[k] / g.block_size)
      throw InputError("block_sparse.pattern",
                       quote(term) + ": dilation " + std::to_string(r[k]) + " must be in 1.." +
                           std::to_string(w[k] / g.block_size) + " (the blocks in its segment of " +
                           std::to_string(w[k]) + " tokens)");
  }
}

}  // namespace

Pattern parse_pattern(const std::string& text, const Geometry& g,
                      const std::vector<int64_t>& segments, const std::vector<int64_t>& dilations,
                      uint64_t default_seed) {
  Pattern p;
  const int64_t nb = g.blocks(), bs = g.block_size;
  if (text.empty()) throw InputError("block_sparse.pattern", "empty; name at least one pattern");
  for (const std::string& term : split(text, '+')) {
    if (term.empty())
      throw InputError("block_sparse.pattern",
                       "empty term in " + quote(text) + " (terms are joined by '+')");
    const auto colon = term.find(':');
    const std::string name = term.substr(0, colon);
    Params prm(term, colon == std::string::npos ? "" : term.substr(colon + 1));
    const int64_t kMax = INT64_MAX / 4;
    // Defaults counted in blocks are capped at the sequence's blocks, as given values are
    // checked against them: the canonical form spells defaults out, and it must parse back
    // (found by fuzz_pattern: "bigbird" on one block described itself as global:blocks=2).
    auto blocks_default = [nb](int64_t d) { return std::min(d, nb); };
    if (name == "local") {
      p.terms.push_back(make_local(g, prm.get("window", 3 * bs, 1, kMax, "tokens")));
      prm.finish("window");
    } else if (name == "global") {
      p.terms.push_back(make_global(g, prm.get("blocks", 1, 1, nb, "blocks in the sequence")));
      prm.finish("blocks");
    } else if (name == "random") {
      const int64_t k = prm.get("blocks", blocks_default(2), 1, nb, "blocks in the sequence");
      const auto seed = static_cast<uint64_t>(
          prm.get("seed", static_cast<int64_t>(default_seed & INT64_MAX), 0, INT64_MAX, "seed"));
      p.terms.push_back(make_random(g, k, seed));
      prm.finish("blocks, seed");
    } else if (name == "strided") {
      const auto dflt = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(nb))));
      p.terms.push_back(make_strided(g, prm.get("stride", dflt, 1, nb, "blocks in the sequence")));
      prm.finish("stride");
    } else if (name == "dilated-blocks") {
      auto w = prm.list("segments", segments);
      auto r = prm.list("dilations", dilations);
      prm.finish("segments, dilations");
      check_dilated(term, g, w, r);
      p.terms.push_back(make_dilated_blocks(g, std::move(w), std::move(r)));
    } else if (name == "bigbird") {
      const int64_t global = prm.get("global", blocks_default(2), 1, nb, "blocks in the sequence");
      const int64_t window = prm.get("window", 3 * bs, 1, kMax, "tokens");
      const int64_t random = prm.get("random", blocks_default(3), 1, nb, "blocks in the sequence");
      const auto seed = static_cast<uint64_t>(
          prm.get("seed", static_cast<int64_t>(default_seed & INT64_MAX), 0, INT64_MAX, "seed"));
      prm.finish("global, window, random, seed");
      p.terms.push_back(make_global(g, global));
      p.terms.push_back(make_local(g, window));
      p.terms.push_back(make_random(g, random, seed));
    } else {
      throw InputError("block_sparse.pattern", "unknown pattern " + quote(name) +
                                                   " (known: local, global, random, strided, "
                                                   "dilated-blocks, bigbird)");
    }
  }
  std::vector<std::string> names;
  for (const auto& t : p.terms) names.push_back(t->describe());
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (std::size_t i = 0; i < names.size(); ++i) p.canonical += (i ? "+" : "") + names[i];
  return p;
}

BlockLists build_lists(const Pattern& p, const Geometry& g) {
  BlockLists l;
  l.heads = g.heads;
  l.blocks = g.blocks();
  l.block_size = g.block_size;
  l.head_list.resize(static_cast<std::size_t>(g.heads));
  std::map<std::vector<int64_t>, int32_t> classes;
  std::vector<int32_t> cols;
  for (int64_t h = 0; h < g.heads; ++h) {
    std::vector<int64_t> key;
    for (const auto& t : p.terms) key.push_back(t->head_class(h));
    auto [it, fresh] = classes.try_emplace(key, static_cast<int32_t>(l.lists.size()));
    l.head_list[static_cast<std::size_t>(h)] = it->second;
    if (!fresh) continue;
    BlockCsr c;
    c.row_ptr.reserve(static_cast<std::size_t>(l.blocks) + 1);
    c.row_ptr.push_back(0);
    for (int64_t i = 0; i < l.blocks; ++i) {
      cols.clear();
      for (const auto& t : p.terms) t->row(h, i, cols);
      std::sort(cols.begin(), cols.end());
      cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
      c.cols.insert(c.cols.end(), cols.begin(), cols.end());
      c.row_ptr.push_back(static_cast<int64_t>(c.cols.size()));
    }
    l.lists.push_back(std::move(c));
  }
  return l;
}

}  // namespace ringattn::sparse
