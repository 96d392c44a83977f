// Array form of the log-sum-exp merge (the ring engine's per-step update).
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels {

void merge_lse(const MergeRows& m) {
#pragma omp parallel for schedule(static) if (m.rows * m.d > (1 << 16))
  for (int64_t r = 0; r < m.rows; ++r)
    merge_lse_row(m.acc_out + r * m.acc_out_stride, m.acc_lse + r * m.acc_lse_stride,
                  m.part_out + r * m.part_out_stride, m.part_lse[r * m.part_lse_stride], m.d);
}

}  // namespace ringattn::kernels
