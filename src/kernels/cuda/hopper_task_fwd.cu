// The Hopper forward over SubseqTasks (see hopper_task_fwd.hpp): hopper_fwd_kernel.cuh's body
// with a block per work item (64 query rows of a task) walking the keys those rows can see
// (visible_key_range, as the native forward), 64 at a time, through tensor maps of the
// launch's query and key views; each row's reach is the task's causal offset and window.
#include "kernels/cuda/hopper_task_fwd.hpp"

#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/hopper_fwd_kernel.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

using hopper::KeyTile;
using hopper::kRows;
using hopper::QueryRows;
using hopper::Reach;

constexpr int64_t kFar = int64_t{1} << 30;  // past any key: no limit

struct TaskWork {
  const SubseqTask* tasks;
  const ForwardItem* items;  // this launch's
  float* out;
  float* lse;
  int rows;     // B·N: the batches' positions end to end
  int kv_rows;  // K/V positions end to end (B·N unless packed)
  int heads, kv_heads, head_dim;
  int q_step, k_step;  // the views' row steps: position n is index n / step of its view
  bool causal;
  float out_scale;

  struct Cursor {
    int k0, k_end;  // the next key tile's first key and the last visible key + 1
    int n0, h, b;   // the task's key 0 in the key view
    int off, n_k;   // the task's causal offset and keys
  };

  __device__ __forceinline__ const SubseqTask& task() const {
    return tasks[items[blockIdx.x].task];
  }

  __device__ __forceinline__ QueryRows query_rows(int d) const {
    const ForwardItem item = items[blockIdx.x];
    const SubseqTask& t = tasks[item.task];
    const int i0 = static_cast<int>(item.q_begin);
    const int n_rows = t.n_q - i0 < kRows ? static_cast<int>(t.n_q - i0) : kRows;
    const int64_t at = t.q_row0 + i0 * t.q_stride;
    int n, h, b;
    hopper::position_of(at, d, heads, rows, n, h, b);
    return {n / q_step,   h,      b,  out + at, lse + t.lse0 + i0 * t.lse_stride, t.q_stride,
            t.lse_stride, n_rows, i0, out_scale};
  }

  __device__ __forceinline__ Cursor begin(const QueryRows& q) const {
    const SubseqTask& t = task();
    const KeyRange keys = visible_key_range(t, causal, q.row0, q.rows);
    Cursor c{};
    c.k0 = static_cast<int>(keys.begin), c.k_end = static_cast<int>(keys.end);
    c.off = static_cast<int>(t.causal_offset), c.n_k = static_cast<int>(t.n_k);
    hopper::position_of(t.k_row0, head_dim, kv_heads, kv_rows, c.n0, c.h, c.b);
    c.n0 /= k_step;
    return c;
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    if (c.k0 >= c.k_end) return false;
    t = {c.n0 + c.k0, c.h, c.b, c.k0 - c.off, c.n_k - c.k0};
    c.k0 += kRows;
    return true;
  }

  // Query i sees key j of the task iff i - window_left <= j - causal_offset <= i + right,
  // right being the window's right reach, at most 0 when causal.
  __device__ __forceinline__ Reach reach(const QueryRows& q, int local) const {
    const SubseqTask& t = task();
    auto clamped = [](int64_t w) { return static_cast<int>(w < kFar ? w : kFar); };
    const int left = t.window_left == kNoWindow ? static_cast<int>(kFar) : clamped(t.window_left);
    int right = t.window_right == kNoWindow ? static_cast<int>(kFar) : clamped(t.window_right);
    if (causal && right > 0) right = 0;
    const int i = q.row0 + local;
    return {i - left, i + right + 1};
  }
};

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
      if (std::string why = view_of(t.k_row0, t.k_stride, t.n_k, s, s.kv_heads,
                                    packed ? 1 : s.batch, packed ? s.kv_rows : s.seq_len, "key",
                                    std::get<2>(key), std::get<3>(key));
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
  return hopper::device_unsupported(s.head_dim, e, device);
}

void hopper_task_forward(Elem e, const FlashForwardParams& p, const HopperTaskShape& s,
                         std::span<const HopperTaskGroup> groups, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_task_forward_unsupported(e, s, device); !why.empty())
    throw RuntimeFailure("the Hopper task forward cannot run: " + why);
  const int rows = s.batch * s.seq_len;  // one "batch" of B·N positions: views never cross
  const int kv_rows = s.kv_rows > 0 ? s.kv_rows : rows;
  for (const HopperTaskGroup& g : groups) {
    if (g.n_items == 0) continue;
    const hopper::Args<TaskWork> a{
        hopper::tensor_map(p.q, e, 1, rows, s.heads, s.head_dim, g.q_phase, g.q_step),
        hopper::tensor_map(p.k, e, 1, kv_rows, s.kv_heads, s.head_dim, g.k_phase, g.k_step),
        hopper::tensor_map(p.v, e, 1, kv_rows, s.kv_heads, s.head_dim, g.k_phase, g.k_step),
        p.scale * 1.4426950408889634f,
        p.accumulate,
        {p.tasks, p.items + g.item0, p.out, p.lse, rows, kv_rows, s.heads, s.kv_heads, s.head_dim,
         g.q_step, g.k_step, p.causal, p.out_scale}};
    hopper::launch_for(s.head_dim, e, "hopper_task_fwd_kernel", a,
                       dim3(static_cast<unsigned>(g.n_items)), stream);
  }
}

}  // namespace ringattn::kernels::cuda
