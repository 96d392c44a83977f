// The six engines of the layers below behind job::Backend: one adapter for the host plans and
// one for the device plans, each a template over the plan, so that what differs between them
// (timings, peers, notes) is said once, by what the plan offers.
#include "job/backends.hpp"

#include <utility>

#include "ring/cuda_ring_engine.hpp"
#include "ring/ring_engine.hpp"
#include "single/plan.hpp"
#include "sparse/cuda_sparse_plan.hpp"
#include "sparse/sparse_plan.hpp"

namespace ringattn::job {

namespace {

PassStats pass_of(const ring::RingTimings& t) {
  return {t.compute_ms, t.comm_ms, t.exposed_ms, t.bytes_sent};
}

// What every plan offers, and what only some do.
template <class P>
void fill_common(const P& plan, EngineStats& s) {
  s.workspace_bytes = plan.workspace_bytes();
  if constexpr (requires { plan.workspace_bytes_per_thread(); })
    s.workspace_bytes_per_thread = plan.workspace_bytes_per_thread();
  if constexpr (requires { plan.last_forward(); }) {
    s.forward = pass_of(plan.last_forward());
    s.backward = pass_of(plan.last_backward());
    s.bytes_sent = s.forward.bytes_sent;
    s.comm_exposed_ms = s.forward.comm_exposed_ms;
  }
  if constexpr (requires { plan.peers(); }) s.peers = plan.peers();
}

template <class P>
class HostBackend final : public Backend {
 public:
  template <class... Args>
  explicit HostBackend(const char* name, Args&&... args)
      : name_(name), plan_(std::forward<Args>(args)...) {}

  void forward(const void* q, const void* k, const void* v, float* out, float* lse) override {
    plan_.forward(f(q), f(k), f(v), out, lse);
  }
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv) override {
    plan_.backward(f(q), f(k), f(v), out, lse, f(dout), dq, dk, dv);
  }
  void fill(EngineStats& s) const override {
    s.engine = name_;
    s.kernel = "cpu";
    s.kernel_backward = "cpu";
    s.threads = plan_.threads();
    fill_common(plan_, s);
  }

 private:
  static const float* f(const void* p) { return static_cast<const float*>(p); }
  const char* name_;
  P plan_;
};

template <class P>
class DeviceBackend final : public Backend {
 public:
  template <class... Args>
  explicit DeviceBackend(const char* name, Args&&... args)
      : name_(name), plan_(std::forward<Args>(args)...) {}

  void forward(const void* q, const void* k, const void* v, float* out, float* lse) override {
    plan_.forward(q, k, v, out, lse);
  }
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv) override {
    plan_.backward(q, k, v, out, lse, dout, dq, dk, dv);
  }
  void synchronize() override { plan_.synchronize(); }
  void* stream() const override { return plan_.stream(); }
  DeviceDType dtype() const override { return plan_.dtype(); }
  void fill(EngineStats& s) const override {
    s.engine = name_;
    s.kernel = plan_.kernel_name();
    s.kernel_backward = s.kernel;
    if constexpr (requires { plan_.backward_kernel_name(); })
      s.kernel_backward = plan_.backward_kernel_name();
    s.dtype = plan_.dtype();
    fill_common(plan_, s);
    s.device_workspace_bytes = s.workspace_bytes;
    if constexpr (requires { plan_.notes(); }) s.notes = plan_.notes();
    if constexpr (requires { plan_.device_description(); })
      s.device_detail = plan_.device_description();
  }

 private:
  const char* name_;
  P plan_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(const ResolvedJob& job, ring::Communicator& comm,
                                           const PlanOptions& opts,
                                           const ring::RingOptions& ring_opts) {
  if (job.lists)
    return std::make_unique<HostBackend<sparse::SparsePlan>>("SparsePlan", job.cfg, job.lists, comm,
                                                             opts, ring_opts);
  if (comm.size() == 1) return std::make_unique<HostBackend<Plan>>("Plan", job.cfg, opts);
  return std::make_unique<HostBackend<ring::RingPlan>>("RingPlan", job.cfg, comm, opts, ring_opts);
}

std::unique_ptr<Backend> make_device_backend(const ResolvedJob& job,
                                             ring::Communicator* device_comm,
                                             const CudaPlanOptions& opts,
                                             const ring::RingOptions& ring_opts) {
  if (!device_comm) {
    if (job.lists)
      return std::make_unique<DeviceBackend<sparse::CudaSparsePlan>>("CudaSparsePlan", job.cfg,
                                                                     job.lists, opts);
    return std::make_unique<DeviceBackend<CudaPlan>>("CudaPlan", job.cfg, opts);
  }
  if (job.lists)
    return std::make_unique<DeviceBackend<sparse::CudaSparsePlan>>(
        "CudaSparsePlan", job.cfg, job.lists, *device_comm, opts, ring_opts);
  return std::make_unique<DeviceBackend<ring::CudaRingPlan>>("CudaRingPlan", job.cfg, *device_comm,
                                                             opts, ring_opts);
}

}  // namespace ringattn::job
