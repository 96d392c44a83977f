// libFuzzer target for packed-sequence offsets (--cu-seqlens): the input is a whole .npy
// file, read as int32/int64 and validated as document offsets of a sequence whose length is
// the last offset. Invariants: the reader and validation refuse with an InputError whose
// message shows input bytes only escaped; accepted offsets give one segment per document,
// attended pairs equal to the sum of squared document lengths, and shard layouts over 2..4
// ranks that hold every position exactly once with N/P rows per rank.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cli/npy.hpp"
#include "core/patterns.hpp"
#include "fuzz_check.hpp"
#include "memory_file.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"

namespace {

using ringattn::fuzz::check;

// Sequences longer than this are accepted by validation but not laid out here (the layout
// costs O(N) per rank count).
constexpr int64_t kMaxLaidOut = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static ringattn::fuzz::MemoryFile file("fuzz_cu_seqlens_input");
  file.set(data, size);
  std::vector<int64_t> cu;
  ringattn::NpyHeader h;
  try {
    cu = ringattn::read_npy_int64(file.path, &h);
  } catch (const ringattn::InputError& e) {
    ringattn::fuzz::check_message(e.what());
    return 0;
  }
  if (h.shape.size() != 1 || cu.size() < 2 || cu.back() <= 0) return 0;
  ringattn::AttentionConfig cfg;
  cfg.shape = {1, cu.back(), 1, 8};
  cfg.cu_seqlens = cu;
  try {
    ringattn::validate(cfg);
  } catch (const ringattn::InputError& e) {
    // The offsets themselves, or the sequence length they imply (too many elements).
    check(e.subject() == "config.cu_seqlens" || e.subject() == "config.shape.seq_len",
          "offsets refused naming something else", e.what());
    ringattn::fuzz::check_message(e.what());
    return 0;
  }
  const int64_t docs = static_cast<int64_t>(cu.size()) - 1;
  const ringattn::SegmentList segs = ringattn::segments_of(cfg, ringattn::patterns_of(cfg)[0]);
  check(segs.count() == docs, "one segment per document");
  if (cfg.shape.seq_len > kMaxLaidOut) return 0;
  double squares = 0;
  for (int64_t d = 0; d < docs; ++d) {
    const auto len =
        static_cast<double>(cu[static_cast<std::size_t>(d) + 1] - cu[static_cast<std::size_t>(d)]);
    squares += len * len;
  }
  check(ringattn::attended_pairs(cfg) == squares, "attended pairs are the squared lengths");
  for (bool causal : {false, true}) {
    cfg.causal = causal;
    for (int world = 2; world <= 4; ++world) {
      if (cfg.shape.seq_len % world != 0) continue;
      const ringattn::ring::ShardLayout l = ringattn::ring::make_layout(cfg, world);
      std::vector<int> seen(static_cast<std::size_t>(cfg.shape.seq_len), 0);
      for (int r = 0; r < world; ++r) {
        int64_t rows = 0;
        for (const ringattn::ring::Chunk& c : l.chunks(r)) {
          check(c.local_begin == rows, "chunks packed back to back");
          rows += c.length;
          for (int64_t p = c.begin; p < c.begin + c.length; ++p)
            ++seen[static_cast<std::size_t>(p)];
        }
        check(rows == l.local_len, "N/P rows per rank");
      }
      for (int s : seen) check(s == 1, "every position on exactly one rank");
    }
  }
  return 0;
}
