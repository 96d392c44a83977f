// The run's inputs and gathered outputs (inputs.hpp).
#include "cli/inputs.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cli/npy.hpp"

namespace ringattn::cli {

namespace {

// The dimensions of a [B, N, H, D] file.
constexpr const char* kDimNames[] = {"batch (dim 0)", "sequence length (dim 1)", "heads (dim 2)",
                                     "head dim (dim 3)"};

// Element ranges of the rows `rows` (global positions, local order) in a [B, N, H, D] file:
// consecutive positions coalesce into one range.
std::vector<std::pair<int64_t, int64_t>> row_ranges(const std::vector<int64_t>& rows,
                                                    const Shape4& s) {
  std::vector<std::pair<int64_t, int64_t>> r;
  const int64_t inner = s.heads * s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (std::size_t i = 0; i < rows.size();) {
      std::size_t j = i + 1;
      while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
      r.push_back({(b * s.seq_len + rows[i]) * inner, static_cast<int64_t>(j - i) * inner});
      i = j;
    }
  return r;
}

}  // namespace

std::string file_subject(const std::string& option, const std::string& path) {
  return option + " (" + path + ")";
}

Shape4 shape_of(const std::string& option, const std::string& path) {
  const NpyHeader h = reading(option, path, [&] { return read_npy_header(path); });
  const std::string subject = file_subject(option, path);
  if (h.shape.size() != 4)
    throw InputError(subject, "array has rank " + std::to_string(h.shape.size()) +
                                  ", expected rank 4 [B,N,H,D]");
  for (std::size_t i = 0; i < 3; ++i)
    if (h.shape[i] <= 0)
      throw InputError(subject, std::string(kDimNames[i]) + " must be positive, got " +
                                    std::to_string(h.shape[i]));
  if (h.shape[3] <= 0 || h.shape[3] > kMaxHeadDim)
    throw InputError(subject, std::string(kDimNames[3]) + " must be in 1.." +
                                  std::to_string(kMaxHeadDim) + ", got " +
                                  std::to_string(h.shape[3]));
  return {h.shape[0], h.shape[1], h.shape[2], h.shape[3]};
}

std::vector<int64_t> read_cu_seqlens(const std::string& path, int64_t seq_len) {
  const std::string subject = file_subject("--cu-seqlens", path);
  NpyHeader h;
  std::vector<int64_t> cu = reading("--cu-seqlens", path, [&] { return read_npy_int64(path, &h); });
  if (h.shape.size() != 1 || cu.size() < 2) {
    std::string dims;
    for (int64_t d : h.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw InputError(subject,
                     "expected a 1-D array of n_docs + 1 >= 2 offsets, got shape [" + dims + "]");
  }
  if (cu.front() != 0)
    throw InputError(subject, "the first offset must be 0, got " + std::to_string(cu.front()));
  for (std::size_t d = 0; d + 1 < cu.size(); ++d)
    if (cu[d + 1] <= cu[d])
      throw InputError(subject, "offsets must increase strictly: element " + std::to_string(d + 1) +
                                    " is " + std::to_string(cu[d + 1]) + " after " +
                                    std::to_string(cu[d]) +
                                    " (every document needs at least one token)");
  if (cu.back() != seq_len)
    throw InputError(subject, "the last offset must be the sequence length " +
                                  std::to_string(seq_len) + ", got " + std::to_string(cu.back()));
  return cu;
}

std::vector<uint8_t> read_block_mask(const std::string& path, std::vector<int64_t>& dims) {
  const NpyHeader h = reading("--block-mask", path, [&] { return read_npy_header(path); });
  if (h.dtype != NpyDtype::bool8)
    throw InputError(file_subject("--block-mask", path),
                     "block mask must be a bool array (numpy dtype bool, '|b1')");
  dims = h.shape;
  return reading("--block-mask", path, [&] { return read_npy_bool(path); });
}

std::vector<float> read_sinks(const std::string& path, int64_t heads) {
  const std::string subject = file_subject("--sinks", path);
  const NpyHeader h = reading("--sinks", path, [&] { return read_npy_header(path); });
  if (h.dtype != NpyDtype::float32)
    throw InputError(subject, "sinks must be float32 (numpy dtype '<f4'), one logit per head");
  if (h.shape.size() != 1 || h.shape[0] != heads) {
    std::string shape = "[";
    for (std::size_t i = 0; i < h.shape.size(); ++i)
      shape += (i ? ", " : "") + std::to_string(h.shape[i]);
    throw InputError(subject, "sinks must have shape [" + std::to_string(heads) +
                                  "] (one logit per query head), got " + shape + "]");
  }
  std::vector<float> sinks = reading("--sinks", path, [&] { return read_npy_float(path); });
  for (std::size_t i = 0; i < sinks.size(); ++i)
    if (std::isnan(sinks[i]) || sinks[i] == std::numeric_limits<float>::infinity())
      throw InputError(subject, "head " + std::to_string(i) + "'s sink is " +
                                    (std::isnan(sinks[i]) ? "NaN" : "+inf") +
                                    "; a sink is a finite logit, or -inf for none");
  return sinks;
}

void load_shard(const std::string& option, const std::string& path,
                const std::vector<int64_t>& rows, const Shape4& s, HostTensor& t) {
  const auto ranges = row_ranges(rows, s);
  const std::vector<float> data =
      reading(option, path, [&] { return read_npy_float_ranges(path, ranges); });
  std::size_t i = 0;
  for (const auto& [first, count] : ranges)
    for (int64_t j = 0; j < count; ++j, ++i)
      if (!std::isfinite(data[i]))
        throw InputError(file_subject(option, path),
                         "element " + std::to_string(first + j) + " is " +
                             (std::isnan(data[i]) ? "NaN" : "infinite") +
                             "; inputs must be finite");
  std::copy(data.begin(), data.end(), t.data());
}

// Uniform on [-sqrt(3), sqrt(3)] (unit variance) from a counter-based hash of the global
// element index, so every rank generates its own shard of the same tensor, for any thread
// count and any number of ranks (and a sampled check can regenerate any row).
float synthetic_value(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>((2.0 * u - 1.0) * 1.7320508075688772);
}

void fill_synthetic(HostTensor& t, const std::vector<int64_t>& rows, const Shape4& s, uint64_t seed,
                    uint64_t stream) {
  float* p = t.data();
  for (const auto& range : row_ranges(rows, s)) {
    // Plain locals: clang (before 16) cannot use structured bindings inside an OpenMP region.
    const int64_t first = range.first, count = range.second;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i)
      p[i] = synthetic_value(seed, stream, static_cast<uint64_t>(first + i));
    p += count;
  }
}

void insert_local(const std::vector<int64_t>& rows, int64_t batch, int64_t seq_len, int64_t inner,
                  bool is_lse, const float* local, float* full) {
  const auto nl = static_cast<int64_t>(rows.size());
  if (is_lse) {  // [B, heads, N]: positions are the last axis
    for (int64_t bh = 0; bh < batch * inner; ++bh)
      for (int64_t i = 0; i < nl; ++i)
        full[bh * seq_len + rows[static_cast<std::size_t>(i)]] = local[bh * nl + i];
    return;
  }
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < nl; ++i)
      std::copy_n(local + (b * nl + i) * inner, inner,
                  full + (b * seq_len + rows[static_cast<std::size_t>(i)]) * inner);
}

}  // namespace ringattn::cli
