// Builds the backend (engine_impl.hpp) a resolved job runs on: the host plans (Plan on one
// rank, RingPlan on several, SparsePlan for block-sparse) or the device plans (CudaPlan,
// CudaRingPlan, CudaSparsePlan).
#pragma once

#include <memory>

#include "job/engine_impl.hpp"
#include "ring/ring_engine.hpp"
#include "single/cuda_plan.hpp"
#include "single/plan.hpp"

namespace ringattn::job {

std::unique_ptr<Backend> make_host_backend(const ResolvedJob& job, ring::Communicator& comm,
                                           const PlanOptions& opts,
                                           const ring::RingOptions& ring_opts);

// `device_comm`: null on one rank (the single-device plans), else the ranks' device
// communicator.
std::unique_ptr<Backend> make_device_backend(const ResolvedJob& job,
                                             ring::Communicator* device_comm,
                                             const CudaPlanOptions& opts,
                                             const ring::RingOptions& ring_opts);

}  // namespace ringattn::job
