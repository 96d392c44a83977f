// What the library API tests of tests/job share: a named job (config and, for block-sparse,
// pattern) and taking one rank's rows out of a whole [B, N, inner] tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ringattn/config.hpp"

namespace ringattn::testing {

struct JobCase {
  std::string name;
  AttentionConfig cfg;
  std::string pattern;  // block-sparse
};

// Rows `rows` of a [B, N, heads, D] tensor (float or double), as float.
template <typename T>
std::vector<float> rows_of(const std::vector<T>& full, const std::vector<int64_t>& rows,
                           int64_t batch, int64_t seq_len, int64_t inner) {
  std::vector<float> local;
  for (int64_t b = 0; b < batch; ++b)
    for (const int64_t p : rows)
      for (int64_t c = 0; c < inner; ++c)
        local.push_back(
            static_cast<float>(full[static_cast<std::size_t>((b * seq_len + p) * inner + c)]));
  return local;
}

}  // namespace ringattn::testing
