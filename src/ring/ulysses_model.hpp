// The cost model that picks the Ulysses x ring split P = U x R for `--ulysses auto`: a C++
// port of bench/ring_model.py's Ulysses model (same formulas, same numbers; the tests compare
// them). The ranks form R groups of U consecutive ranks; an all-to-all inside a group turns
// each rank's N/P positions of all H heads into the group's N/R positions of H/U heads, the
// ring runs over the groups, and a reverse all-to-all brings the outputs back.
//
// Per call, with n = N/P, h = H/U query heads and g = max(1, H_kv/U) K/V heads per rank after
// the all-to-all, e bytes per element, D the q/k head dim and Dv the v/out/dout/dv one
// (docs/COMMUNICATION.md, "Ulysses x ring"):
//   compute   C = 2·n·N·H·(D + Dv) (×1/2 causal) / F_fwd, plus 2.5× that FLOP count / F_bwd
//             backward; independent of the split.
//   all-to-all (never overlapped) per phase: (U-1)·n·(T·e + F·4 + 4·h) bytes / W_a
//             + 2·(U-1)·lat_a, with T elements a position in the input dtype and F in fp32:
//             forward T = (h + g)·D + g·Dv (q, k, v in), F = h·Dv (out back); backward
//             T = (h + g)·(D + Dv) (q, k, v, dout in), F = (h + g)·(D + Dv) (out in, dq, dk,
//             dv back); 4·h for the fp32 lse; each direction is U-1 shifted exchanges, one
//             latency each.
//   ring exposed per phase: ·max(0, s / W_r + lat_r - C_phase / R), a step moving
//             s = (N/R)·g·(D + Dv)·e bytes forward, (N/R)·g·(D + Dv)·(e + partial_bytes)
//             backward.
//   total = compute + all-to-all + ring exposed.
// Links: the all-to-all runs on the intra-node link when every group sits inside one node
// (P <= ranks_per_node, or U divides ranks_per_node), else on the inter-node link; the ring
// runs on the intra-node link only when P <= ranks_per_node. Inter-node traffic among more
// than leaf_ranks ranks gets spine_factor of the bandwidth.
#pragma once

#include <cstdint>
#include <vector>

namespace ringattn::ring {

// Achieved rates per rank, one direction.
struct Links {
  double intra_gbs, intra_latency_us;  // inside a node (NVLink, shared memory)
  double inter_gbs, inter_latency_us;  // across nodes, this rank's share
  double fwd_tflops, bwd_tflops;       // attention kernel rates
  int leaf_ranks;                      // ranks under one leaf switch
  double spine_factor;                 // bandwidth fraction past the leaf
};

// bench/ring_model.py's defaults: H100 nodes, NVLink 360 GB/s (80% of 450), one 400 Gb/s NIC
// per GPU (45 GB/s achieved), bf16 flash at 400/300 TFLOP/s.
Links h100_nodes();
// CPU ranks. Assumptions measured nowhere, chosen only to order the splits sensibly.
Links cpu_hosts();

struct ModelShape {
  int world = 1;           // P
  int ranks_per_node = 1;  // consecutive ranks share a node
  int64_t seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int elem_bytes = 4;  // q, k, v, dout as they travel (out, dq, dk, dv, lse travel in fp32)
  bool causal = false;
  bool backward = false;  // forward then backward
  int partial_bytes = 4;  // the ring's dK/dV partials (fp32 in every engine)
  int64_t head_dim_v = 0;  // v, out, dout, dv (MLA's 128 beside 192); 0: head_dim
  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

struct SplitEstimate {
  int ulysses = 1, ring = 1;
  double compute_s = 0, a2a_s = 0, ring_exposed_s = 0, total_s = 0;
};

// U divides P and H, and each rank gets whole K/V heads (U divides H_kv) or query heads of
// a single K/V head (H_kv divides U, i.e. H/U divides H/H_kv).
bool ulysses_split_valid(int64_t heads, int64_t kv_heads, int world, int u);

// Every valid split, ascending U (U = 1, the plain ring, always first). Throws InputError
// for a shape the model cannot price (non-positive sizes, H_kv not dividing H).
std::vector<SplitEstimate> estimate_splits(const ModelShape& shape, const Links& links);

// The lowest total; ties go to the smaller U, which moves fewer bytes.
int recommend_ulysses(const ModelShape& shape, const Links& links);

}  // namespace ringattn::ring
