// The Hopper forward over SubseqTasks (see hopper/task_forward.hpp): hopper/forward_mainloop.cuh's
// body over hopper/work_tasks.cuh's TaskWork, a block per work item (64 query rows of a task)
// walking the keys those rows can see, through tensor maps of the launch's query and key
// views; and the grouping of items by view that every task launch needs.
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/hopper/forward_launch.cuh"
#include "kernels/cuda/hopper/task_forward.hpp"
#include "kernels/cuda/hopper/work_tasks.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

// Where a view of `n` rows `stride` elements apart from element `row0` sits in a tensor of
// `batches` × `seq` positions of `heads` heads: its step and phase over the positions end to
// end; "" or why it is no such view.
std::string view_of(int64_t row0, int64_t stride, int64_t n, const HopperTaskShape& s, int heads,
                    int64_t batches, int64_t seq, const char* what, int& step, int& phase) {
  const int64_t d = s.head_dim, row = static_cast<int64_t>(heads) * d;
  if (row0 % d != 0) return std::string(what) + " rows that do not start a head's row";
  if (n > 1 && (stride <= 0 || stride % row != 0))
    return std::string(what) + " rows " + std::to_string(stride) +
           " elements apart (not a multiple of a position's " + std::to_string(row) + ")";
  const int64_t st = n > 1 ? stride / row : 1;
  const int64_t pos = row0 / row;  // b·N + position: the maps run over the batches end to end
  if (pos / seq >= batches) return std::string(what) + " rows past the tensor";
  if (pos % seq + (n - 1) * st >= seq) return std::string(what) + " view that leaves its batch";
  if (st > std::numeric_limits<int>::max() / 2) return std::string(what) + " step past int";
  step = static_cast<int>(st);
  phase = static_cast<int>(pos % st);
  return "";
}

}  // namespace

std::string hopper_task_groups(std::span<const SubseqTask> tasks,
                               std::span<const ForwardItem> items, const HopperTaskShape& s,
                               std::vector<ForwardItem>& ordered,
                               std::vector<HopperTaskGroup>& groups) {
  ordered.clear();
  groups.clear();
  if (s.batch <= 0 || s.seq_len <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0)
    return "an empty tensor shape";
  if (static_cast<int64_t>(s.batch) * s.seq_len > std::numeric_limits<int>::max() / 2)
    return "B·N past int (tensor map coordinates)";
  using Key = std::tuple<int, int, int, int>;  // q step, q phase, k step, k phase
  std::map<Key, std::vector<ForwardItem>> by_view;
  for (const ForwardItem& it : items) {
    if (it.task < 0 || it.task >= static_cast<int64_t>(tasks.size()))
      return "an item names a task past the list";
    const SubseqTask& t = tasks[static_cast<std::size_t>(it.task)];
    if (t.n_q > std::numeric_limits<int>::max() / 2 || t.n_k > std::numeric_limits<int>::max() / 2)
      return "a task of more than 2^30 rows";
    Key key{};
    if (std::string why = view_of(t.q_row0, t.q_stride, t.n_q, s, s.heads, s.batch, s.seq_len,
                                  "query", std::get<0>(key), std::get<1>(key));
        !why.empty())
      return why;
    if (t.n_k > 0) {
      const bool packed = s.kv_rows > 0;
      if (std::string why =
              view_of(t.k_row0, t.k_stride, t.n_k, s, s.kv_heads, packed ? 1 : s.batch,
                      packed ? s.kv_rows : s.seq_len, "key", std::get<2>(key), std::get<3>(key));
          !why.empty())
        return why;
    } else {
      std::get<2>(key) = 1;
    }
    by_view[key].push_back(it);
  }
  for (const auto& [key, list] : by_view) {
    HopperTaskGroup g;
    g.item0 = static_cast<int64_t>(ordered.size());
    g.n_items = static_cast<int64_t>(list.size());
    std::tie(g.q_step, g.q_phase, g.k_step, g.k_phase) = key;
    if (g.n_items > std::numeric_limits<int>::max()) return "more work items than a grid holds";
    ordered.insert(ordered.end(), list.begin(), list.end());
    groups.push_back(g);
  }
  return "";
}

std::string hopper_task_forward_unsupported(Elem e, const HopperTaskShape& s, int device) {
  if (s.batch <= 0 || s.seq_len <= 0 || s.heads <= 0 || s.kv_heads <= 0)
    return "an empty tensor shape";
  if (static_cast<int64_t>(s.batch) * s.seq_len > std::numeric_limits<int>::max() / 2 ||
      s.kv_rows < 0 || s.kv_rows > std::numeric_limits<int>::max() / 2)
    return "B·N past int (tensor map coordinates)";
  return hopper::device_unsupported(s.head_dim, e, device, s.head_dim_v);
}

void hopper_task_forward(Elem e, const FlashForwardParams& p, const HopperTaskShape& s,
                         std::span<const HopperTaskGroup> groups, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_task_forward_unsupported(e, s, device); !why.empty())
    throw RuntimeFailure("the Hopper task forward cannot run: " + why);
  const int rows = s.batch * s.seq_len;  // one "batch" of B·N positions: views never cross
  const int kv_rows = s.kv_rows > 0 ? s.kv_rows : rows;
  const int dv = hopper::task_value_dim(s, p);
  for (const HopperTaskGroup& g : groups) {
    if (g.n_items == 0) continue;
    const hopper::Args<hopper::TaskWork> a{
        hopper::tensor_map(p.q, e, 1, rows, s.heads, s.head_dim, g.q_phase, g.q_step),
        hopper::tensor_map(p.k, e, 1, kv_rows, s.kv_heads, s.head_dim, g.k_phase, g.k_step),
        hopper::tensor_map(p.v, e, 1, kv_rows, s.kv_heads, dv, g.k_phase, g.k_step),
        hopper::logits_of(p.scale, p.softcap),
        p.accumulate,
        {p.tasks, p.items + g.item0, p.out, p.lse, rows, kv_rows, s.heads, s.kv_heads, s.head_dim,
         g.q_step, g.k_step, p.causal, p.out_scale}};
    hopper::launch_for(s.head_dim, dv, e, "hopper_task_fwd_kernel", a,
                       dim3(static_cast<unsigned>(g.n_items)), stream, s.form);
  }
}

}  // namespace ringattn::kernels::cuda
