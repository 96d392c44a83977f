// A consumer of the installed ringattn package: LongNet-style dilated attention (grouped,
// three patterns) forward on one process through make_engine, checked against the library's
// float64 reference.
// Uses only the public headers (<ringattn/...>). Exit 0 when within tolerance.
#include <cmath>
#include <cstdio>
#include <random>
#include <ringattn/errors.hpp>
#include <ringattn/reference.hpp>
#include <ringattn/ringattn.hpp>
#include <vector>

int main() {
  ringattn::JobSpec spec;
  spec.device = ringattn::Device::cpu;
  ringattn::AttentionConfig& cfg = spec.config;
  cfg.shape = {1, 512, 6, 64};  // [B, N, H, D]
  cfg.attention = ringattn::AttentionKind::dilated;
  cfg.combine = ringattn::Combine::grouped;
  cfg.segments = {128, 256, 512};
  cfg.dilations = {1, 2, 4};
  cfg.causal = true;
  try {
    ringattn::validate(cfg);
  } catch (const ringattn::InputError& e) {
    std::fprintf(stderr, "bad config: %s\n", e.what());
    return 2;
  }

  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  std::vector<float> q(n), k(n), v(n), out(n);
  std::vector<float> lse(
      static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len));
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(gen);

  ringattn::Comm comm = ringattn::Comm::single();
  ringattn::Engine engine = ringattn::make_engine(spec, comm);  // plan and workspace, once
  engine.forward(q.data(), k.data(), v.data(), out.data(), lse.data());

  const ringattn::ReferenceForward ref =
      ringattn::reference_forward(cfg, q.data(), k.data(), v.data());
  const double err_out = ringattn::relative_error(out.data(), ref.out.data(), n);
  const double err_lse = ringattn::relative_error(lse.data(), ref.lse.data(), lse.size());
  const double tolerance = 1e-5;
  const bool ok = err_out <= tolerance && err_lse <= tolerance;
  std::printf(
      "ringattn %s from the installed package: dilated grouped causal forward [1,512,6,64]\n"
      "  vs float64 reference: out %.2e lse %.2e (tolerance %.0e) -> %s\n",
      RINGATTN_VERSION, err_out, err_lse, tolerance, ok ? "OK" : "NOT OK");
  return ok ? 0 : 1;
}
