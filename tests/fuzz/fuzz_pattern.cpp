// libFuzzer target for the --pattern language (src/sparse/pattern.hpp). The first three
// bytes choose a small geometry and the --segments/--dilations a dilated-blocks term falls
// back to; the rest is the pattern text. Invariants: text is refused with an InputError on
// --pattern whose message shows the text only escaped, or parsed into a canonical form
// that parses back to itself and to the same block lists; the lists are well formed (rows
// sorted, unique, in range) and survive mask and transpose round trips.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "sparse/block_lists.hpp"
#include "sparse/pattern.hpp"

namespace {

using ringattn::InputError;
using ringattn::fuzz::check;
namespace sparse = ringattn::sparse;

void check_well_formed(const sparse::BlockLists& l, const sparse::Geometry& g) {
  check(l.heads == g.heads && l.blocks == g.blocks() && l.block_size == g.block_size,
        "lists have the wrong geometry");
  check(l.head_list.size() == static_cast<std::size_t>(g.heads), "head_list has the wrong size");
  check(!l.lists.empty() && l.lists.size() <= static_cast<std::size_t>(g.heads),
        "more lists than heads");
  for (const int32_t i : l.head_list)
    check(i >= 0 && static_cast<std::size_t>(i) < l.lists.size(), "head_list out of range");
  for (const sparse::BlockCsr& c : l.lists) {
    check(c.row_ptr.size() == static_cast<std::size_t>(l.blocks) + 1 && c.row_ptr[0] == 0 &&
              c.row_ptr.back() == c.nnz(),
          "row_ptr has the wrong shape");
    for (int64_t i = 0; i < l.blocks; ++i) {
      check(c.row_ptr[i] <= c.row_ptr[i + 1], "row_ptr decreases");
      const auto row = c.row(i);
      for (std::size_t k = 0; k < row.size(); ++k) {
        check(row[k] >= 0 && row[k] < l.blocks, "key block out of range");
        check(k == 0 || row[k - 1] < row[k], "row not sorted and unique");
      }
    }
  }
}

bool same_rows(const sparse::BlockLists& a, const sparse::BlockLists& b) {
  if (a.heads != b.heads || a.blocks != b.blocks) return false;
  for (int64_t h = 0; h < a.heads; ++h) {
    const sparse::BlockCsr &x = a.of_head(h), &y = b.of_head(h);
    if (x.row_ptr != y.row_ptr || x.cols != y.cols) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  // Small geometries keep each run cheap: at most 48 blocks and 8 heads.
  constexpr int64_t kBlockSizes[] = {1, 2, 16, 64, 128};
  const int64_t blocks = 1 + data[0] % 48;
  const int64_t block_size = kBlockSizes[data[1] % 5];
  const sparse::Geometry g{blocks * block_size, block_size, 1 + (data[1] / 5) % 8};
  std::vector<int64_t> segments, dilations;
  if (data[2] % 3 >= 1) {
    segments.push_back(g.seq_len);
    dilations.push_back(1);
  }
  if (data[2] % 3 == 2) {
    segments.push_back(g.seq_len);
    dilations.push_back(blocks < 2 ? 1 : 2);
  }
  const uint64_t seed = data[2] / 3;
  const std::string text(reinterpret_cast<const char*>(data) + 3, size - 3);

  sparse::Pattern p;
  try {
    p = sparse::parse_pattern(text, g, segments, dilations, seed);
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e, "block_sparse.pattern");
    return 0;
  }
  check(!p.terms.empty() && !p.canonical.empty(), "a pattern without terms was accepted");

  // The canonical form spells out every parameter: it needs no defaults to parse again.
  sparse::Pattern again;
  try {
    again = sparse::parse_pattern(p.canonical, g, {}, {}, seed + 1);
  } catch (const InputError& e) {
    ringattn::fuzz::fail("the canonical form does not parse", p.canonical + " -> " + e.what());
  }
  check(again.canonical == p.canonical, "canonical form is not a fixed point",
        p.canonical + " -> " + again.canonical);

  const sparse::BlockLists lists = sparse::build_lists(p, g);
  check_well_formed(lists, g);
  check(same_rows(lists, sparse::build_lists(again, g)), "canonical form gives other lists",
        p.canonical);
  // Through a dense mask and back, and transposed twice, the lists are unchanged.
  const std::vector<uint8_t> mask = sparse::mask_from_lists(lists);
  check(same_rows(lists,
                  sparse::lists_from_mask(mask.data(), g.heads, g.heads, g.blocks(), g.block_size)),
        "mask round trip changed the lists", p.canonical);
  for (const sparse::BlockCsr& c : lists.lists) {
    const sparse::BlockCsr t = sparse::transpose(sparse::transpose(c, g.blocks()), g.blocks());
    check(t.row_ptr == c.row_ptr && t.cols == c.cols, "transpose is not an involution");
  }
  const double s = sparse::sparsity(lists, false);
  check(s >= 0.0 && s < 1.0, "sparsity outside [0, 1) for a non-empty pattern");
  return 0;
}
