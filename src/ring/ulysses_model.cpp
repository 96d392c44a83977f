// The Ulysses x ring cost model (formulas in ulysses_model.hpp). Every expression keeps
// bench/ring_model.py's operand order, so both give the same doubles and tests can compare
// them to 1e-9.
#include "ring/ulysses_model.hpp"

#include <algorithm>

#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

struct Link {
  double bytes_per_s, latency_s;
};

Link intra_node(const Links& l) { return {l.intra_gbs * 1e9, l.intra_latency_us * 1e-6}; }

Link inter_node(const Links& l, int ranks) {
  // Past one leaf switch, permutation traffic crosses the spine, where hash collisions cost
  // a fraction of the bandwidth.
  const double factor = ranks > l.leaf_ranks ? l.spine_factor : 1.0;
  return {l.inter_gbs * 1e9 * factor, l.inter_latency_us * 1e-6};
}

// Every ring step has some rank whose peer is on another node once P spans nodes.
Link ring_link(const ModelShape& s, const Links& l) {
  return s.world <= s.ranks_per_node ? intra_node(l) : inter_node(l, s.world);
}

Link a2a_link(const ModelShape& s, const Links& l, int u) {
  const bool groups_inside_nodes = s.world <= s.ranks_per_node || s.ranks_per_node % u == 0;
  return groups_inside_nodes ? intra_node(l) : inter_node(l, u);
}

void check_shape(const ModelShape& s) {
  if (s.world < 1 || s.ranks_per_node < 1 || s.seq_len < 1 || s.heads < 1 || s.kv_heads < 1 ||
      s.head_dim < 1 || s.head_dim_v < 0 || s.elem_bytes < 1 || s.partial_bytes < 1)
    throw InputError("ulysses", "the split model needs positive ranks and sizes");
  if (s.heads % s.kv_heads != 0)
    throw InputError("ulysses", "the split model needs K/V heads dividing the heads");
}

// One phase (forward or backward) of a call at split u.
struct Phase {
  double flop_factor, tflops;
  int64_t in_elems;   // elements a position's all-to-alls move in the input dtype
  int64_t f32_elems;  // and in fp32, as the engines keep results (out, dq, dk, dv)
  int64_t ring_elem;  // bytes per K/V element a ring step moves
};

SplitEstimate estimate(const ModelShape& s, const Links& l, int u) {
  const int r = s.world / u;
  const double n = double(s.seq_len) / double(s.world);  // tokens per rank before the all-to-all
  const int64_t hr = s.heads / u;                        // query heads per rank after it
  const int64_t kvr = std::max<int64_t>(1, s.kv_heads / u);  // one, shared, when U > H_kv
  const Link wa = a2a_link(s, l, u), wr = ring_link(s, l);
  const int64_t d = s.head_dim, dv = s.value_dim();
  // S = Q·Kᵀ sums over D, P·V over Dv.
  const double flops =
      2.0 * n * double(s.seq_len) * double(s.heads) * double(d + dv) * (s.causal ? 0.5 : 1.0);
  // Forward: q, k (D), v (Dv) in, out (Dv) back. Backward: q, k, v, dout and (fp32) out in,
  // dq, dk (D), dv (Dv) back.
  std::vector<Phase> phases = {{1.0, l.fwd_tflops, (hr + kvr) * d + kvr * dv, hr * dv,
                                s.elem_bytes}};
  if (s.backward)
    phases.push_back({2.5, l.bwd_tflops, (hr + kvr) * d + (hr + kvr) * dv,
                      (hr + kvr) * d + (hr + kvr) * dv, s.elem_bytes + s.partial_bytes});

  SplitEstimate e{u, r};
  for (const Phase& p : phases) {
    const double c = p.flop_factor * flops / (p.tflops * 1e12);
    const double sent =
        double(u - 1) * n * double(p.in_elems * s.elem_bytes + p.f32_elems * 4 + hr * 4);
    const double step = (double(s.seq_len) / double(r)) * double(kvr) * double(d + dv) *
                        double(p.ring_elem);
    e.compute_s += c;
    e.a2a_s += sent / wa.bytes_per_s + double(2 * (u - 1)) * wa.latency_s;
    e.ring_exposed_s +=
        double(r - 1) * std::max(0.0, step / wr.bytes_per_s + wr.latency_s - c / double(r));
  }
  e.total_s = e.compute_s + e.a2a_s + e.ring_exposed_s;
  return e;
}

}  // namespace

Links h100_nodes() {
  return {.intra_gbs = 360,
          .intra_latency_us = 10,
          .inter_gbs = 45,
          .inter_latency_us = 20,
          .fwd_tflops = 400,
          .bwd_tflops = 300,
          .leaf_ranks = 256,
          .spine_factor = 0.8};
}

Links cpu_hosts() {
  // Not measured: rough rates for a multi-core host (compute per rank, shared-memory MPI
  // inside a host, a 10 GbE-class network across hosts), set only so that the splits come
  // out in a sensible order. No spine penalty is assumed.
  return {.intra_gbs = 10,
          .intra_latency_us = 5,
          .inter_gbs = 1.2,
          .inter_latency_us = 50,
          .fwd_tflops = 0.15,
          .bwd_tflops = 0.06,
          .leaf_ranks = 256,
          .spine_factor = 1.0};
}

bool ulysses_split_valid(int64_t heads, int64_t kv_heads, int world, int u) {
  return u >= 1 && heads >= 1 && kv_heads >= 1 && world % u == 0 && heads % u == 0 &&
         (kv_heads % u == 0 || u % kv_heads == 0);
}

std::vector<SplitEstimate> estimate_splits(const ModelShape& shape, const Links& links) {
  check_shape(shape);
  std::vector<SplitEstimate> out;
  for (int u = 1; u <= shape.world; ++u)
    if (ulysses_split_valid(shape.heads, shape.kv_heads, shape.world, u))
      out.push_back(estimate(shape, links, u));
  return out;
}

int recommend_ulysses(const ModelShape& shape, const Links& links) {
  const std::vector<SplitEstimate> splits = estimate_splits(shape, links);
  const SplitEstimate* best = &splits.front();
  for (const SplitEstimate& e : splits)
    if (e.total_s < best->total_s) best = &e;
  return best->ulysses;
}

}  // namespace ringattn::ring
