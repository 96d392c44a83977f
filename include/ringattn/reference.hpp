// The float64 reference: every attention mode computed straight from the definitions in
// docs/SEMANTICS.md, with no tiling and no tricks. Used by the tests and by `--check`.
// Inputs are float32 [B, N, H, D]; results are float64 in the same layouts as the fast path
// (out/dq/dk/dv [B, N, H, D], lse [B, H, N]).
#pragma once

#include <vector>

#include "ringattn/config.hpp"

namespace ringattn {

struct ReferenceForward {
  std::vector<double> out;
  std::vector<double> lse;  // -inf where a row attends to nothing
};

struct ReferenceGradients {
  std::vector<double> dq, dk, dv;
};

ReferenceForward reference_forward(const AttentionConfig& cfg, const float* q, const float* k,
                                   const float* v);

// Gradients of sum(out * dout) with respect to q, k and v.
ReferenceGradients reference_backward(const AttentionConfig& cfg, const float* q, const float* k,
                                      const float* v, const float* dout);

// ||got - want||_F / ||want||_F (0 when both are zero); infinite entries must match exactly
// in position and sign, else the result is +inf.
double relative_error(const float* got, const double* want, std::size_t n);
double relative_error(const float* got, const float* want, std::size_t n);

}  // namespace ringattn
