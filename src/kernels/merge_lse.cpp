// Array form of the log-sum-exp merge (the ring engine's per-step update).
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels {

void merge_lse(const MergeRows& m) {
#pragma omp parallel for schedule(static) if (m.rows * m.d > (1 << 16))
  for (int64_t r = 0; r < m.rows; ++r) {
    const int64_t la =
        m.lse_heads ? shard_lse_index(r, m.lse_heads, m.lse_rows) : r * m.acc_lse_stride;
    const int64_t lb = m.lse_heads ? la : r * m.part_lse_stride;
    merge_lse_row(m.acc_out + r * m.acc_out_stride, m.acc_lse + la,
                  m.part_out + r * m.part_out_stride, m.part_lse[lb], m.d);
  }
}

}  // namespace ringattn::kernels
