// CudnnGraphPlan on the emulated GPU (see cudnn/graphs.hpp), for tests only: cuDNN does not
// run on the emulator, so with RINGATTN_EMU_CUDNN_STANDIN=1 a view's graph is a reference
// computation in its place (float64 sums over the view's strided io-type tensors, results
// rounded to the io type as cuDNN writes them), enqueued on the plan's stream. What it stands
// in for is cuDNN's SDPA contract (the forward's O and natural-log stats; the backward's dQ,
// dK, dV from O, dO and the stats, dK/dV summed over a K/V head's query heads; values of
// their own head dim, and the soft-cap score modifier with its backward), so the code
// around it (the GPU ring's per-step views, epilogues and gradient adds) runs in CI; cuDNN
// itself runs on a GPU only. Without the variable every constructor throws, as where cuDNN
// cannot be loaded. Test hooks: RINGATTN_EMU_CUDNN_REFUSE=band|one_token_backward (graphs
// refused, as by a cuDNN that cannot build them) and RINGATTN_EMU_CUDNN_EMPTY_ROWS (what rows
// without keys return).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/environment.hpp"
#include "emu/numeric_formats.hpp"
#include "emu/runtime.hpp"
#include "kernels/cuda/cudnn/graphs.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

bool cudnn_standin_enabled() {
  const char* v = environment_value(Env::emu_cudnn_standin);
  return v && std::string(v) == "1";
}

namespace {

// An io-type tensor read and written through a view's strides.
struct Io {
  bool fp16 = false;
  double get(const void* base, int64_t at) const {
    const auto bits = static_cast<const std::uint16_t*>(base)[at];
    return fp16 ? emu::f16_to_float(bits) : emu::bf16_to_float(bits);
  }
  void put(void* base, int64_t at, double x) const {
    const auto f = static_cast<float>(x);
    static_cast<std::uint16_t*>(base)[at] = fp16 ? emu::float_to_f16(f) : emu::float_to_bf16(f);
  }
};

struct Geometry {
  SdpaView v;
  int64_t kv_rows() const { return v.kv_rows > 0 ? v.kv_rows : v.rows; }
  int64_t q_at(int64_t b, int64_t h, int64_t i) const {
    return b * v.q_stride[0] + h * v.q_stride[1] + i * v.q_stride[2];
  }
  int64_t kv_at(int64_t b, int64_t h, int64_t j) const {  // h: the query head
    return b * v.kv_stride[0] + h / (v.heads / v.kv_heads) * v.kv_stride[1] + j * v.kv_stride[2];
  }
  // O and dO (o_stride), V and dV (v_stride): the values' rows.
  int64_t o_at(int64_t b, int64_t h, int64_t i) const {
    const auto s = v.o_stride();
    return b * s[0] + h * s[1] + i * s[2];
  }
  int64_t v_at(int64_t b, int64_t h, int64_t j) const {
    const auto s = v.v_stride();
    return b * s[0] + h / (v.heads / v.kv_heads) * s[1] + j * s[2];
  }
  // The scaled score of a q·k dot product, soft-capped as the score modifier does, and the
  // cap's slope d(score)/d(scaled).
  double score(double dot) const {
    const double x = dot * v.scale;
    return v.softcap > 0 ? v.softcap * std::tanh(x / v.softcap) : x;
  }
  double slope(double dot) const {
    if (v.softcap <= 0) return 1.0;
    const double t = std::tanh(dot * v.scale / v.softcap);
    return 1.0 - t * t;
  }
  bool sees(int64_t i, int64_t j) const {
    return (!v.right_bound || j <= i + *v.right_bound) && (!v.left_bound || i - *v.left_bound < j);
  }
};

// What the stand-in returns for a view row that sees no key (RINGATTN_EMU_CUDNN_EMPTY_ROWS):
// cuDNN's answer there is not part of its contract, so tests make the epilogues meet each of
// zero (O and dQ 0, stats -inf: the default), nan (NaN everywhere) and garbage (finite
// values that look like a result: O and dQ 1000, stats 3).
enum class EmptyRows { zero, nan, garbage };
EmptyRows empty_rows() {
  const char* v = environment_value(Env::emu_cudnn_empty_rows);
  const std::string s = v ? v : "";
  return s == "nan" ? EmptyRows::nan : s == "garbage" ? EmptyRows::garbage : EmptyRows::zero;
}
double empty_value(EmptyRows e) {
  return e == EmptyRows::nan ? std::nan("") : e == EmptyRows::garbage ? 1000.0 : 0.0;
}
float empty_stat(EmptyRows e) {
  return e == EmptyRows::nan ? std::nanf("") : e == EmptyRows::garbage ? 3.0f : -INFINITY;
}

void run_on(void* stream, std::function<void()> task) {
  const cudaError_t e = emu::runtime::enqueue(static_cast<cudaStream_t>(stream), std::move(task));
  if (e != cudaSuccess) throw RuntimeFailure("the emulated cuDNN stand-in could not be enqueued");
}

}  // namespace

struct CudnnGraphPlan::Impl {
  std::vector<SdpaView> views;
  std::vector<int64_t> stats_offsets;
  int64_t stats_floats = 0;
  Io io;
  void* stream = nullptr;
  bool with_backward = false;
};

// A configuration's views (sdpa_views), as cuDNN's plan takes them (CudnnSdpa's tests).
CudnnGraphPlan::CudnnGraphPlan(const AttentionConfig& cfg, DeviceDType dtype, int device,
                               void* stream, bool with_backward)
    : CudnnGraphPlan(sdpa_views_or_throw(cfg), dtype, device, stream, with_backward) {}

CudnnGraphPlan::CudnnGraphPlan(std::vector<SdpaView> views, DeviceDType dtype, int, void* stream,
                               bool with_backward)
    : impl_(std::make_unique<Impl>()) {
  if (!cudnn_standin_enabled())
    throw std::runtime_error(
        "cuDNN does not run on the emulated GPU (RINGATTN_EMU_CUDNN_STANDIN=1 runs a reference "
        "in its place, for tests)");
  if (dtype == DeviceDType::fp32)
    throw std::runtime_error("cuDNN's fused attention takes bf16 or fp16 inputs, not fp32");
  // Tests: RINGATTN_EMU_CUDNN_REFUSE=band refuses every view with a diagonal band, as a
  // cuDNN that cannot build such a graph (its version, a bound it does not take) would;
  // =one_token_backward refuses the backward of a 1 x 1 view, as cuDNN 9.19 does.
  const char* refuse = environment_value(Env::emu_cudnn_refuse);
  const std::string refusal = refuse ? refuse : "";
  for (const SdpaView& v : views) {
    if (refusal == "band" && (v.left_bound || v.right_bound))
      throw std::runtime_error(
          "the cuDNN stand-in refuses views with a diagonal band (RINGATTN_EMU_CUDNN_REFUSE)");
    if (refusal == "one_token_backward" && with_backward && v.rows == 1 &&
        (v.kv_rows == 0 || v.kv_rows == 1))
      throw std::runtime_error(
          "the cuDNN stand-in refuses the backward of s_q = s_kv = 1 (RINGATTN_EMU_CUDNN_REFUSE)");
  }
  Impl& m = *impl_;
  m.views = std::move(views);
  m.io.fp16 = dtype == DeviceDType::fp16;
  m.stream = stream;
  m.with_backward = with_backward;
  for (const SdpaView& v : m.views) {
    m.stats_offsets.push_back(m.stats_floats);
    m.stats_floats += v.batch * v.heads * v.rows;
  }
}

CudnnGraphPlan::~CudnnGraphPlan() = default;

const std::vector<SdpaView>& CudnnGraphPlan::views() const { return impl_->views; }
int64_t CudnnGraphPlan::stats_offset(std::size_t view) const { return impl_->stats_offsets[view]; }
int64_t CudnnGraphPlan::stats_floats() const { return impl_->stats_floats; }
double CudnnGraphPlan::build_ms() const { return 0; }
std::size_t CudnnGraphPlan::workspace_bytes() const { return 0; }
std::string CudnnGraphPlan::description() const {
  return "emulated cuDNN stand-in: " + std::to_string(impl_->views.size()) + " views";
}

void CudnnGraphPlan::forward(const void* q, const void* k, const void* v, void* out, float* stats) {
  for (std::size_t i = 0; i < impl_->views.size(); ++i) forward_view(i, q, k, v, out, stats);
}

void CudnnGraphPlan::forward_view(std::size_t view, const void* q, const void* k, const void* v,
                                  void* out, float* stats) {
  const Impl& m = *impl_;
  const Geometry g{m.views.at(view)};
  const Io io = m.io;
  auto at = [](const void* base, int64_t off) { return static_cast<const char*>(base) + off * 2; };
  const void* qb = at(q, g.v.q_offset);
  const void* kb = at(k, g.v.kv_offset);
  const void* vb = at(v, g.v.v_offset());
  void* ob = static_cast<char*>(out) + g.v.o_offset() * 2;
  float* st = stats + m.stats_offsets[view];
  const EmptyRows empty = empty_rows();
  run_on(m.stream, [=] {
    const SdpaView& w = g.v;
    std::vector<double> s(static_cast<std::size_t>(g.kv_rows()));
    for (int64_t b = 0; b < w.batch; ++b)
      for (int64_t h = 0; h < w.heads; ++h)
        for (int64_t i = 0; i < w.rows; ++i) {
          double mx = -INFINITY;
          for (int64_t j = 0; j < g.kv_rows(); ++j) {
            double dot = 0;
            for (int64_t d = 0; d < w.head_dim; ++d)
              dot += io.get(qb, g.q_at(b, h, i) + d) * io.get(kb, g.kv_at(b, h, j) + d);
            s[static_cast<std::size_t>(j)] = g.sees(i, j) ? g.score(dot) : -INFINITY;
            mx = std::max(mx, s[static_cast<std::size_t>(j)]);
          }
          double sum = 0;
          for (double& x : s) {
            x = mx == -INFINITY ? 0.0 : std::exp(x - mx);
            sum += x;
          }
          for (int64_t d = 0; d < w.value_dim(); ++d) {
            double o = 0;
            for (int64_t j = 0; j < g.kv_rows(); ++j)
              o += s[static_cast<std::size_t>(j)] * io.get(vb, g.v_at(b, h, j) + d);
            io.put(ob, g.o_at(b, h, i) + d, sum > 0 ? o / sum : empty_value(empty));
          }
          st[(b * w.heads + h) * w.rows + i] =
              sum > 0 ? static_cast<float>(mx + std::log(sum)) : empty_stat(empty);
        }
  });
}

void CudnnGraphPlan::backward(const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const float* stats, void* dq, void* dk, void* dv) {
  for (std::size_t i = 0; i < impl_->views.size(); ++i)
    backward_view(i, q, k, v, out, dout, stats, dq, dk, dv);
}

void CudnnGraphPlan::backward_view(std::size_t view, const void* q, const void* k, const void* v,
                                   const void* out, const void* dout, const float* stats, void* dq,
                                   void* dk, void* dv) {
  const Impl& m = *impl_;
  if (!m.with_backward) throw std::logic_error("CudnnGraphPlan: built without the backward");
  const Geometry g{m.views.at(view)};
  const Io io = m.io;
  const int64_t qo = g.v.q_offset * 2, ko = g.v.kv_offset * 2;
  const int64_t oo = g.v.o_offset() * 2, vo = g.v.v_offset() * 2;
  auto c = [](const void* p, int64_t off) { return static_cast<const char*>(p) + off; };
  auto w_ = [](void* p, int64_t off) { return static_cast<char*>(p) + off; };
  const void *qb = c(q, qo), *kb = c(k, ko), *vb = c(v, vo), *ob = c(out, oo), *gb = c(dout, oo);
  void *dqb = w_(dq, qo), *dkb = w_(dk, ko), *dvb = w_(dv, vo);
  const float* st = stats + m.stats_offsets[view];
  const EmptyRows empty = empty_rows();
  run_on(m.stream, [=] {
    const SdpaView& w = g.v;
    const int64_t nk = g.kv_rows(), group = w.heads / w.kv_heads, D = w.head_dim;
    const int64_t Dv = w.value_dim();
    for (int64_t b = 0; b < w.batch; ++b)
      for (int64_t hk = 0; hk < w.kv_heads; ++hk) {
        std::vector<double> gk(static_cast<std::size_t>(nk * D)),
            gv(static_cast<std::size_t>(nk * Dv));
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i = 0; i < w.rows; ++i) {
            const double lse = st[(b * w.heads + h) * w.rows + i];
            double delta = 0;
            for (int64_t d = 0; d < Dv; ++d)
              delta += io.get(gb, g.o_at(b, h, i) + d) * io.get(ob, g.o_at(b, h, i) + d);
            std::vector<double> gq(static_cast<std::size_t>(D));
            bool keyed = false;
            for (int64_t j = 0; j < nk; ++j) keyed = keyed || g.sees(i, j);
            if (!keyed) std::fill(gq.begin(), gq.end(), empty_value(empty));
            for (int64_t j = 0; j < nk; ++j) {
              if (!g.sees(i, j) || lse == -INFINITY) continue;
              double dot = 0, dp = 0;
              for (int64_t d = 0; d < D; ++d)
                dot += io.get(qb, g.q_at(b, h, i) + d) * io.get(kb, g.kv_at(b, h, j) + d);
              for (int64_t d = 0; d < Dv; ++d)
                dp += io.get(gb, g.o_at(b, h, i) + d) * io.get(vb, g.v_at(b, h, j) + d);
              const double p = std::exp(g.score(dot) - lse);
              const double ds = p * (dp - delta) * g.slope(dot) * w.scale;
              for (int64_t d = 0; d < D; ++d) {
                const auto jd = static_cast<std::size_t>(j * D + d);
                gq[static_cast<std::size_t>(d)] += ds * io.get(kb, g.kv_at(b, h, j) + d);
                gk[jd] += ds * io.get(qb, g.q_at(b, h, i) + d);
              }
              for (int64_t d = 0; d < Dv; ++d)
                gv[static_cast<std::size_t>(j * Dv + d)] += p * io.get(gb, g.o_at(b, h, i) + d);
            }
            for (int64_t d = 0; d < D; ++d)
              io.put(dqb, g.q_at(b, h, i) + d, gq[static_cast<std::size_t>(d)]);
          }
        for (int64_t j = 0; j < nk; ++j) {
          for (int64_t d = 0; d < D; ++d)
            io.put(dkb, g.kv_at(b, hk * group, j) + d, gk[static_cast<std::size_t>(j * D + d)]);
          for (int64_t d = 0; d < Dv; ++d)
            io.put(dvb, g.v_at(b, hk * group, j) + d, gv[static_cast<std::size_t>(j * Dv + d)]);
        }
      }
  });
}

}  // namespace ringattn::kernels::cuda
