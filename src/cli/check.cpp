// The float64 check (check.hpp).
#include "cli/check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cli/inputs.hpp"
#include "cli/npy.hpp"
#include "ringattn/reference.hpp"

namespace ringattn::cli {

namespace {

constexpr double kCheckTolerance = 1e-5;
// On CUDA the check compares with the float64 reference of the inputs as the device holds
// them (rounded to --dtype); what remains is the kernels' own rounding (bf16/fp16 P and dS
// in the tensor-core products, fp32 accumulation).
constexpr double kCheckToleranceHalf = 1e-2;
constexpr double kCheckToleranceFp32 = 1e-4;
// The float64 reference visits every (query, key) pair of every head and pattern and does
// O(D) work per attended pair; past this budget it takes minutes.
constexpr double kCheckMaxWork = 4e9;
// Past these sizes a block-sparse --check samples rows instead of gathering everything.
constexpr int64_t kFullCheckMaxElements = int64_t{1} << 24;

bool block_sparse(const Engine& e) { return e.config().attention == AttentionKind::block_sparse; }

double reference_work(const AttentionConfig& cfg) {
  const Shape4& s = cfg.shape;
  const double n = static_cast<double>(s.seq_len);
  // One pass over every (query, key) pair per pattern: one dense pattern, or one per segment.
  const double patterns =
      cfg.attention == AttentionKind::dilated ? static_cast<double>(cfg.segments.size()) : 1.0;
  const double visits = static_cast<double>(s.batch * s.heads) * n * n * patterns;
  return visits +
         attended_pairs(cfg) * static_cast<double>(s.head_dim + cfg.effective_head_dim_v());
}

// The float64 reference's view of a block-sparse run: the run's own lists.
BlockReferenceProblem block_problem(const Engine& e) {
  BlockReferenceProblem pb = block_problem_of(e.config());
  pb.key_blocks = [&e](int64_t h, int64_t i) { return e.key_blocks(h, i); };
  return pb;
}

}  // namespace

double check_tolerance(const Engine& engine) {
  if (engine.device() != Device::cuda) return kCheckTolerance;
  return engine.dtype() == DeviceDType::fp32 ? kCheckToleranceFp32 : kCheckToleranceHalf;
}

void check_reference_fits(const Engine& engine) {
  if (block_sparse(engine)) return;
  const double work = reference_work(engine.config());
  if (work > kCheckMaxWork)
    throw InputError("--check", "problem too large for the float64 reference (" +
                                    std::to_string(static_cast<long long>(work)) +
                                    " operations > " +
                                    std::to_string(static_cast<long long>(kCheckMaxWork)) +
                                    "); use a smaller --seq-len, --batch or --heads");
}

bool samples_rows(const Engine& engine) {
  if (!block_sparse(engine)) return false;
  const AttentionConfig& cfg = engine.config();
  // Attended pairs (over the batch) times the reference's O(D) work per pair.
  const double work = engine.stats().attended_pairs *
                      static_cast<double>(cfg.shape.head_dim + cfg.effective_head_dim_v());
  return work > kCheckMaxWork || cfg.shape.numel() > kFullCheckMaxElements;
}

std::pair<double, double> sampled_check(const RunOptions& opts, Comm& comm, const Engine& engine,
                                        const HostTensor& q, const HostTensor& out,
                                        const HostTensor& lse, const std::vector<float>& sinks) {
  const AttentionConfig& cfg = engine.config();
  const Shape4& s = cfg.shape;
  const int64_t D = s.head_dim, H = s.heads, NL = engine.local_len(), bs = cfg.block_size;
  const int64_t Dv = cfg.effective_head_dim_v();
  const std::vector<int64_t> positions = engine.local_rows();
  BlockReferenceProblem pb = block_problem(engine);
  pb.sinks = sinks;
  double out_diff = 0, out_want = 0, lse_diff = 0, lse_want = 0;
  bool inf_mismatch = false;
  const int64_t rows = std::min(kSampledRows, NL);
  std::vector<double> ref(static_cast<std::size_t>(Dv));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < rows; ++k) {
        const int64_t r = rows == 1 ? 0 : k * (NL - 1) / (rows - 1);
        const int64_t p = positions[static_cast<std::size_t>(r)];
        // Positions of every listed key block (the reference applies causality itself).
        std::vector<int64_t> keys;
        for (int64_t j : engine.key_blocks(h, p / bs))
          for (int64_t t = j * bs; t < (j + 1) * bs; ++t) keys.push_back(t);
        const int64_t kv_heads = cfg.effective_kv_heads(), kvh = cfg.kv_head_of(h);
        std::vector<float> kv[2];
        for (int which = 0; which < 2; ++which) {
          const std::string& path = which == 0 ? opts.k_path : opts.v_path;
          const int64_t w = which == 0 ? D : Dv;  // k's head dim, then v's
          auto element = [&](int64_t t) { return ((b * s.seq_len + t) * kv_heads + kvh) * w; };
          if (path.empty()) {
            kv[which].resize(keys.size() * static_cast<std::size_t>(w));
            for (std::size_t i = 0; i < keys.size(); ++i)
              for (int64_t c = 0; c < w; ++c)
                kv[which][i * static_cast<std::size_t>(w) + static_cast<std::size_t>(c)] =
                    synthetic_value(opts.seed, static_cast<uint64_t>(2 + which),
                                    static_cast<uint64_t>(element(keys[i]) + c));
          } else {
            std::vector<std::pair<int64_t, int64_t>> ranges;
            for (int64_t t : keys) ranges.push_back({element(t), w});
            kv[which] = read_npy_float_ranges(path, ranges);
          }
        }
        auto index_of = [&](int64_t t, int64_t w) {
          return static_cast<std::size_t>(std::lower_bound(keys.begin(), keys.end(), t) -
                                          keys.begin()) *
                 static_cast<std::size_t>(w);
        };
        double ref_lse = 0;
        const std::size_t at = static_cast<std::size_t>(((b * NL + r) * H + h) * D);
        const std::size_t out_at = static_cast<std::size_t>(((b * NL + r) * H + h) * Dv);
        reference_row_blocks(
            pb, h, p, q.data() + at, [&](int64_t t) { return kv[0].data() + index_of(t, D); },
            [&](int64_t t) { return kv[1].data() + index_of(t, Dv); }, ref.data(), &ref_lse);
        for (int64_t c = 0; c < Dv; ++c) {
          const double g = out.data()[out_at + static_cast<std::size_t>(c)];
          const double want = ref[static_cast<std::size_t>(c)];
          out_diff += (g - want) * (g - want);
          out_want += want * want;
        }
        const double got_lse = lse.data()[(b * H + h) * NL + r];
        if (std::isinf(ref_lse) || std::isinf(got_lse)) {
          inf_mismatch |= got_lse != ref_lse;
        } else {
          lse_diff += (got_lse - ref_lse) * (got_lse - ref_lse);
          lse_want += ref_lse * ref_lse;
        }
      }
  auto rel = [](double diff, double want) {
    return want == 0 ? std::sqrt(diff) : std::sqrt(diff) / std::sqrt(want);
  };
  const double inf = std::numeric_limits<double>::infinity();
  return {comm.max(rel(out_diff, out_want)),
          comm.max(inf_mismatch ? inf : rel(lse_diff, lse_want))};
}

std::vector<CheckResult> full_check(const Engine& engine, const WholeTensors& t, bool backward) {
  const AttentionConfig& cfg = engine.config();
  const auto n_full = static_cast<std::size_t>(cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());
  const auto n_out = static_cast<std::size_t>(cfg.out_shape().numel());
  const auto n_lse =
      static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len);
  std::vector<CheckResult> r;
  const bool blocks = block_sparse(engine);
  BlockReferenceProblem pb = blocks ? block_problem(engine) : BlockReferenceProblem{};
  if (t.sinks) pb.sinks.assign(t.sinks, t.sinks + cfg.shape.heads);
  const ReferenceForward ref = blocks ? reference_forward_blocks(pb, t.q, t.k, t.v)
                                      : reference_forward(cfg, t.q, t.k, t.v, t.sinks);
  r.push_back({"out", relative_error(t.out, ref.out.data(), n_out)});
  r.push_back({"lse", relative_error(t.lse, ref.lse.data(), n_lse)});
  if (backward) {
    const ReferenceGradients g = blocks ? reference_backward_blocks(pb, t.q, t.k, t.v, t.dout)
                                        : reference_backward(cfg, t.q, t.k, t.v, t.dout, t.sinks);
    r.push_back({"dq", relative_error(t.dq, g.dq.data(), n_full)});
    r.push_back({"dk", relative_error(t.dk, g.dk.data(), n_kv)});
    r.push_back({"dv", relative_error(t.dv, g.dv.data(), n_v)});
    if (t.dsinks)
      r.push_back({"dsinks", relative_error(t.dsinks, g.dsinks.data(), g.dsinks.size())});
  }
  return r;
}

}  // namespace ringattn::cli
