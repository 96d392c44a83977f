// What an Engine holds: the resolved job, its shard layout, the communicators it runs on and
// one backend (a plan of the layers below behind one interface, so that nothing above this
// file chooses between six engines). Internal: front ends see only ringattn/ringattn.hpp
// (whose Engine accessors read from here).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/sharding.hpp"
#include "ringattn/device.hpp"
#include "ringattn/ringattn.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::job {

// One engine of the layers below (Plan, RingPlan, SparsePlan and their CUDA counterparts).
// Pointers are to this rank's shard: host float32 for the CPU backends, device memory (inputs
// in dtype(), results fp32) for the GPU ones, enqueued on stream().
class Backend {
 public:
  virtual ~Backend() = default;
  virtual void forward(const void* q, const void* k, const void* v, float* out, float* lse) = 0;
  virtual void backward(const void* q, const void* k, const void* v, const float* out,
                        const float* lse, const void* dout, float* dq, float* dk, float* dv) = 0;
  virtual void synchronize() {}
  virtual void* stream() const { return nullptr; }  // GPU backends: their cudaStream_t
  virtual DeviceDType dtype() const { return DeviceDType::fp32; }
  // The engine-specific part of EngineStats (name, kernel, workspace, timings, ...).
  virtual void fill(EngineStats& s) const = 0;
};

// The resolved job: every `auto` decided, the config validated.
struct ResolvedJob {
  AttentionConfig cfg;
  Device device = Device::cpu;
  std::shared_ptr<const sparse::BlockLists> lists;  // block-sparse jobs
  std::string pattern_text;                         // canonical pattern or the mask's name
  std::string auto_note;                            // what attention = auto decided
  std::string device_note;  // why device = auto passed over a usable GPU (empty: it did not)
  // The ring's layout: over all ranks, or with Ulysses over the P / U groups, each group's
  // shard split into U consecutive pieces, one per member (local_len() rows each).
  ring::ShardLayout layout;
  int ulysses = 1;
  int64_t local_len() const { return layout.local_len / ulysses; }
};

// Engine::Impl, by a name the functions that build it can take.
struct EngineState {
  job::ResolvedJob job;
  Comm comm;
  int device_index = 0;  // the GPU of a cuda engine
  bool deterministic = false;
  bool sinks = false;  // JobSpec::sinks
  // The device communicator of a multi-rank GPU engine (NCCL or device copies); declared
  // before the backend, whose communication thread uses it until the backend is gone.
  std::unique_ptr<ring::Communicator> device_comm;
  std::unique_ptr<job::Backend> backend;
  // Host calls on a GPU engine: device copies of the shard, allocated on first use.
  struct Staging {
    DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv;
  };
  std::unique_ptr<Staging> staging;
  Staging& stage(bool backward_too);
  // The device sinks' gradient's workspace (kernels::cuda::sink_gradient), on first use.
  DeviceBuffer sink_workspace;

  explicit EngineState(Comm c) : comm(std::move(c)) {}
  ~EngineState();
  bool on_gpu() const { return job.device == Device::cuda; }
};

}  // namespace ringattn::job

namespace ringattn {

struct Engine::Impl : job::EngineState {
  using job::EngineState::EngineState;
};

}  // namespace ringattn
