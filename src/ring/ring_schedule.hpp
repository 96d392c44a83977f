// The distributed schedule for one rank: at step t it sends its rows to rank r+t and
// receives rows from rank r-t (mod P), so every needed row goes straight to the rank that
// needs it, once. Only the rows a pattern selects travel (every r-th row at the pattern's
// offset, for the heads that use it), and only up to the last position a causal query can
// see; steps with nothing to compute or move are empty. Built once per plan, identically on
// every rank, so senders and receivers agree on every packed layout without talking.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_flash.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"

namespace ringattn::ring {

// The selected rows of one (pattern, head, batch, segment) that lie in one chunk of a rank.
// Query runs name a query head and index q/out/lse; key runs name a K/V head and index the
// owner's k/v/dk/dv ([B, N/P, HKV, D]), and serve every query head of that K/V head that
// selects the same rows (grouped-query attention moves only K/V heads).
struct Run {
  int pattern = 0;
  int chunk = 0;
  int64_t head = 0, batch = 0, segment = 0;
  int64_t k_begin = 0, k_end = 0;    // indices into the segment's selected positions
  int64_t row0 = 0;                  // element offset of row k_begin in the owner's local tensor
  int64_t stride = 0;                // elements between consecutive selected rows
  int64_t lse0 = 0, lse_stride = 0;  // into the owner's local lse [B, H, N/P]
  int64_t rows() const { return k_end - k_begin; }
};

// Tasks that may run in one parallel forward call: no two share query rows. Key rows are
// shared only by query heads of one K/V group (grouped-query attention); the backward runs
// tasks [0, e0), [e0, e1), ... (e_i = backward_ends[i]) as separate calls, in order, and
// within each no two tasks share key rows (see KernelPass::backward_ends).
struct Wave {
  std::vector<kernels::SubseqTask> tasks;
  std::vector<kernels::ForwardItem> items;  // forward work, most expensive first
  std::vector<std::size_t> backward_ends;
};

struct RingStep {
  int send_to = -1;            // -1: nothing to send this step
  int recv_from = -1;          // -1: nothing to receive (and, for steps > 0, nothing to compute)
  std::vector<Run> send_runs;  // my rows the peer needs, packed in this order
  std::vector<Run> recv_runs;  // the peer's rows I receive (offsets are the peer's), in order
  int64_t send_rows = 0, recv_rows = 0;
  // Key views: step 0 reads the local K/V; later steps read the packed receive buffer
  // (K rows then V rows, each [recv_rows, D]).
  std::vector<Wave> waves;
};

struct RingSchedule {
  std::vector<RingStep> steps;  // steps[0]: the rank's own block
  int64_t max_send_rows = 0, max_recv_rows = 0;
  int64_t bytes_sent = 0;  // forward K/V bytes this rank sends (the backward sends as many
                           // dK/dV bytes back, fp32, and receives K/V again)
};

// `slice`: the job's heads the config computes (default: all of them).
RingSchedule build_ring_schedule(const AttentionConfig& cfg, const ShardLayout& layout, int rank,
                                 const kernels::TileConfig& tiles, const HeadSlice& slice = {});

// Whether runs name one row twice: a dilated mixture (two patterns select a position), or a
// K/V head shared by head groups of two patterns (grouped GQA). The dK/dV returned for such
// runs must be added row after row; added in parallel, two read-modify-writes of one row race.
bool runs_repeat_a_row(const std::vector<Run>& runs);

// The fewest K/V bytes rank `rank` must send in the forward: for every other rank, every row
// (position, K/V head) of a pattern that one of that rank's queries attends to, K and V,
// fp32, counted once per pattern that needs it (however many query heads share the K/V
// head). Computed from position ranges, independently of the schedule, so the engine's
// counted traffic can be checked against it.
int64_t minimum_bytes_sent(const AttentionConfig& cfg, const ShardLayout& layout, int rank,
                           const HeadSlice& slice = {});

}  // namespace ringattn::ring
