// make_engine and the Engine: the setup errors of every rank agreed on (so no rank is left
// waiting in a collective or an exchange), the device communicator chosen and made, the
// backend built once; then each call hands this rank's shard to the backend, staging host
// tensors through the device for GPU engines, and ordering device work after the caller's
// stream.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <new>
#include <optional>
#include <string>

#include "job/agree.hpp"
#include "job/backends.hpp"
#include "job/comm_access.hpp"
#include "job/engine_impl.hpp"
#include "job/resolve.hpp"
#include "job/ulysses.hpp"
#include "kernels/attention_sinks.hpp"
#include "kernels/cpu_blas.hpp"
#include "kernels/cuda/runtime/stream_order.hpp"
#include "ring/device_transport.hpp"
#include "ring/fault_injection.hpp"
#include "ring/nccl_communicator.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sub_communicator.hpp"
#include "ringattn/field_words.hpp"
#include "ringattn/ringattn.hpp"
#include "sparse/sparse_plan.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn {

namespace {

ring::RingOptions ring_options(const JobSpec& spec) {
  ring::RingOptions r;
  r.timeout_s = spec.timeout_s;
  r.fault = ring::FaultInjection::from_env();
  r.on_step = spec.on_step;
  return r;
}

// The device communicator of a GPU job on several ranks (NCCL or device copies), and the
// GPU this rank computes on.
// Whether each rank runs one single-GPU plan on its whole share (no ring around it): Ulysses
// with U = P, dense or dilated (block-sparse always has its own distributed plan).
bool single_plan_per_rank(const job::EngineState& m) {
  return !m.job.lists && m.job.ulysses > 1 && m.job.ulysses == m.comm.size();
}

void make_device_comm(job::EngineState& m, const JobSpec& spec) {
  ring::Communicator& comm = CommAccess::communicator(m.comm);
  const int gpus = std::max(1, probe_cuda_device().device_count);
  const ring::DeviceTransport t = ring::choose_device_transport(
      {to_string(spec.transport), comm.size(), comm.in_process(), gpus});
  m.device_index = ring::device_of_rank(t, comm.rank(), comm.local_rank(), gpus);
  if (spec.device_index >= 0) {
    if (spec.device_index >= gpus)
      throw InputError("device", "GPU " + std::to_string(spec.device_index) +
                                     " does not exist (this machine has " + std::to_string(gpus) +
                                     ")");
    m.device_index = spec.device_index;
  }
  if (t == ring::DeviceTransport::device_copies)
    m.device_comm = ring::make_device_inproc_communicator(comm, m.device_index);
  else if (t == ring::DeviceTransport::nccl)
    m.device_comm = ring::make_nccl_communicator(comm, {spec.timeout_s});
  // cuDNN runs on single-GPU plans and on the GPU ring's steps (dense attention: each step's
  // tasks as cuDNN views); block-sparse's local and received blocks have no cuDNN kernels.
  if (m.device_comm && m.job.lists && spec.kernel == KernelChoice::cudnn &&
      !single_plan_per_rank(m))
    throw InputError("kernel",
                     "'cudnn' has no block-sparse kernels: the GPU block-sparse mode runs " +
                         field_is("kernel", "native") + ", hopper or auto");
}

// The kernel choice reaches every device plan. auto on the ring or distributed block-sparse
// is resolved by its plan: the sm_90a kernels where they run, else native; cudnn on the ring
// runs each step's views on cuDNN where they map (else a note and the auto choice).
CudaPlanOptions device_options(const job::EngineState& m, const JobSpec& spec) {
  CudaPlanOptions o{spec.dtype.value_or(DeviceDType::bf16), spec.kernel, m.device_index,
                    spec.deterministic};
  o.timeout_s = spec.timeout_s;
  return o;
}

// Ulysses x ring: the backend of this rank's slice on the ring of its head slice (the ranks
// of the same place in every group), inside the all-to-alls of its group.
void build_ulysses(job::EngineState& m, const JobSpec& spec) {
  ring::Communicator& comm = CommAccess::communicator(m.comm);
  const int u = m.job.ulysses, p = comm.rank(), groups = comm.size() / u;
  const job::UlyssesSlice slice = job::ulysses_slice(m.job.cfg, m.job.lists, u, p % u);
  job::ResolvedJob inner = m.job;
  inner.cfg = slice.cfg;
  inner.lists = slice.lists;
  inner.ulysses = 1;
  std::vector<int> group_members, ring_members;
  for (int i = 0; i < u; ++i) group_members.push_back(p / u * u + i);
  for (int g = 0; g < groups; ++g) ring_members.push_back(g * u + p % u);
  ring::Communicator& base = m.on_gpu() ? *m.device_comm : comm;
  // RINGATTN_FAULT_INJECT names a rank of the job: armed on that rank's ring only.
  ring::RingOptions ring_opts = ring_options(spec);
  if (ring_opts.fault.rank >= 0) ring_opts.fault.rank = ring_opts.fault.rank == p ? p / u : -1;
  auto group = ring::make_sub_communicator(base, group_members);
  auto ring_comm = ring::make_sub_communicator(base, ring_members);
  std::unique_ptr<job::Backend> backend;
  std::unique_ptr<job::Moves> moves;
  if (m.on_gpu()) {
    CudaPlanOptions opts = device_options(m, spec);
    opts.heads = slice.heads;
    backend =
        job::make_device_backend(inner, groups > 1 ? ring_comm.get() : nullptr, opts, ring_opts);
    moves = job::make_device_moves(backend->stream(), m.device_index);
  } else {
    PlanOptions opts{spec.threads};
    opts.heads = slice.heads;
    backend = job::make_host_backend(inner, *ring_comm, opts, ring_opts);
    moves = job::make_host_moves();
  }
  m.backend = job::make_ulysses_backend(slice, m.job.local_len(), comm, std::move(group),
                                        std::move(ring_comm), std::move(backend), std::move(moves),
                                        spec.timeout_s);
}

void build(job::EngineState& m, const JobSpec& spec) {
  ring::Communicator& comm = CommAccess::communicator(m.comm);
  if (m.on_gpu()) make_device_comm(m, spec);
  if (m.job.ulysses > 1) return build_ulysses(m, spec);
  if (!m.on_gpu()) {
    m.backend = job::make_host_backend(m.job, comm, {spec.threads}, ring_options(spec));
    return;
  }
  m.backend = job::make_device_backend(m.job, m.device_comm.get(), device_options(m, spec),
                                       ring_options(spec));
}

// This rank's out and lse as the sinks' epilogue and gradient read them.
kernels::SinkRows sink_rows(const job::EngineState& m) {
  const AttentionConfig& c = m.job.cfg;
  return {c.shape.batch, m.job.local_len(), c.shape.heads, c.effective_head_dim_v(), c.layout};
}

// The element counts of this rank's q (dq), k (dk), v (dv), out (dout) and lse.
struct StagedSizes {
  std::size_t n = 0, n_kv = 0, n_v = 0, n_out = 0, n_lse = 0;
};

StagedSizes staged_sizes(const job::ResolvedJob& j) {
  const AttentionConfig& c = j.cfg;
  const auto rows = static_cast<std::size_t>(c.shape.batch * j.local_len());
  const auto h = static_cast<std::size_t>(c.shape.heads);
  const auto hkv = static_cast<std::size_t>(c.effective_kv_heads());
  const auto d = static_cast<std::size_t>(c.shape.head_dim);
  const auto dv = static_cast<std::size_t>(c.effective_head_dim_v());
  return {rows * h * d, rows * hkv * d, rows * hkv * dv, rows * h * dv, rows * h};
}

// A host call's q, k, v uploaded into the staging buffers in the engine's dtype.
StagedSizes stage_inputs(const job::EngineState& m, job::EngineState::Staging& s, const float* q,
                         const float* k, const float* v) {
  const StagedSizes z = staged_sizes(m.job);
  const DeviceDType t = m.backend->dtype();
  s.q.upload(q, z.n, t);
  s.k.upload(k, z.n_kv, t);
  s.v.upload(v, z.n_v, t);
  return z;
}

// Sinks are given to a call exactly when the job has them.
void check_sinks_given(const job::EngineState& m, bool sinks, bool dsinks, bool backward) {
  if (m.sinks && !sinks)
    throw InputError("sinks", "the job has attention sinks (JobSpec::sinks): pass their logits");
  if (!m.sinks && sinks)
    throw InputError("sinks", "given to a job without them (set JobSpec::sinks)");
  if (backward && m.sinks && !dsinks)
    throw InputError("dsinks", "the job has attention sinks: pass where their gradient goes");
}

}  // namespace

// --- Engine ---------------------------------------------------------------------------------

job::EngineState::~EngineState() {
  // The backend's communication thread uses the device communicator: the backend goes first.
  backend.reset();
  staging.reset();
  device_comm.reset();
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

Engine make_engine(const JobSpec& spec, Comm& comm) {
  ring::Communicator& c = CommAccess::communicator(comm);
  c.set_collective_timeout(spec.timeout_s);
  auto impl = std::make_unique<Engine::Impl>(comm);
  job::Ranks ranks{c.size(), c.in_process(), true};
  // Ulysses auto keeps a group inside a node: ranks per node from the node-local ranks.
  if (spec.ulysses == 0 && c.size() > 1)
    ranks.per_node = static_cast<int>(c.max(static_cast<int64_t>(c.local_rank()))) + 1;
  job::agree_on_errors(c, [&] { impl->job = job::resolve(spec, ranks); });
  impl->deterministic = spec.deterministic;
  impl->sinks = spec.sinks;
  job::agree_on_errors(c, [&] { build(*impl, spec); });
  return Engine(std::move(impl));
}

const AttentionConfig& Engine::config() const noexcept { return impl_->job.cfg; }
Device Engine::device() const noexcept { return impl_->job.device; }
DeviceDType Engine::dtype() const noexcept { return impl_->backend->dtype(); }
int Engine::rank() const noexcept { return impl_->comm.rank(); }
int Engine::world_size() const noexcept { return impl_->comm.size(); }
int64_t Engine::local_len() const noexcept { return impl_->job.local_len(); }

std::vector<int64_t> Engine::rows_of(int rank) const { return job::rows_of(impl_->job, rank); }
std::vector<int64_t> Engine::local_rows() const { return rows_of(rank()); }

Shape4 Engine::local_shape() const noexcept {
  const Shape4& s = config().shape;
  return {s.batch, local_len(), s.heads, s.head_dim};
}
Shape4 Engine::local_kv_shape() const noexcept {
  const Shape4& s = config().shape;
  return {s.batch, local_len(), config().effective_kv_heads(), s.head_dim};
}
Shape4 Engine::local_v_shape() const noexcept {
  const Shape4& s = config().shape;
  return {s.batch, local_len(), config().effective_kv_heads(), config().effective_head_dim_v()};
}
Shape4 Engine::local_out_shape() const noexcept {
  const Shape4& s = config().shape;
  return {s.batch, local_len(), s.heads, config().effective_head_dim_v()};
}

void Engine::synchronize() { impl_->backend->synchronize(); }

int Engine::device_index() const noexcept { return impl_->on_gpu() ? impl_->device_index : -1; }

std::vector<int64_t> Engine::key_blocks(int64_t head, int64_t query_block) const {
  const sparse::BlockLists* l = impl_->job.lists.get();
  if (!l) return {};
  const auto row = l->of_head(head).row(query_block);
  return std::vector<int64_t>(row.begin(), row.end());
}

std::vector<uint8_t> Engine::block_mask() const {
  const sparse::BlockLists* l = impl_->job.lists.get();
  return l ? sparse::mask_from_lists(*l) : std::vector<uint8_t>{};
}

// The device copies of this rank's shard for host calls, allocated on the first call that
// needs each (the forward's five, the backward's four more).
job::EngineState::Staging& job::EngineState::stage(bool backward_too) {
  const StagedSizes z = staged_sizes(job);
  const std::size_t eb = bytes_per_element(backend->dtype());
  const int dev = device_index;
  if (!staging) {
    staging = std::make_unique<Staging>();
    staging->q = DeviceBuffer(z.n * eb, "q (staged)", dev);
    staging->k = DeviceBuffer(z.n_kv * eb, "k (staged)", dev);
    staging->v = DeviceBuffer(z.n_v * eb, "v (staged)", dev);
    staging->out = DeviceBuffer(z.n_out * sizeof(float), "out (staged)", dev);
    staging->lse = DeviceBuffer(z.n_lse * sizeof(float), "lse (staged)", dev);
  }
  if (backward_too && !staging->dq.data()) {
    staging->dout = DeviceBuffer(z.n_out * eb, "dout (staged)", dev);
    staging->dq = DeviceBuffer(z.n * sizeof(float), "dq (staged)", dev);
    staging->dk = DeviceBuffer(z.n_kv * sizeof(float), "dk (staged)", dev);
    staging->dv = DeviceBuffer(z.n_v * sizeof(float), "dv (staged)", dev);
  }
  return *staging;
}

void Engine::forward(const float* q, const float* k, const float* v, float* out, float* lse,
                     const float* sinks) {
  Impl& m = *impl_;
  check_sinks_given(m, sinks != nullptr, false, false);
  if (!m.on_gpu()) {
    m.backend->forward(q, k, v, out, lse);
  } else {
    job::EngineState::Staging& s = m.stage(false);
    const StagedSizes z = stage_inputs(m, s, q, k, v);
    m.backend->forward(s.q.data(), s.k.data(), s.v.data(), s.out.as<float>(), s.lse.as<float>());
    m.backend->synchronize();
    s.out.download(out, z.n_out);
    s.lse.download(lse, z.n_lse);
  }
  if (sinks) kernels::apply_sinks(sink_rows(m), sinks, out, lse, 0);
}

void Engine::backward(const float* q, const float* k, const float* v, const float* out,
                      const float* lse, const float* dout, float* dq, float* dk, float* dv,
                      const float* sinks, float* dsinks) {
  Impl& m = *impl_;
  check_sinks_given(m, sinks != nullptr, dsinks != nullptr, true);
  if (!m.on_gpu()) {
    m.backend->backward(q, k, v, out, lse, dout, dq, dk, dv);
  } else {
    job::EngineState::Staging& s = m.stage(true);
    const StagedSizes z = stage_inputs(m, s, q, k, v);
    s.out.upload(out, z.n_out, DeviceDType::fp32);
    s.lse.upload(lse, z.n_lse, DeviceDType::fp32);
    s.dout.upload(dout, z.n_out, dtype());
    m.backend->backward(s.q.data(), s.k.data(), s.v.data(), s.out.as<float>(), s.lse.as<float>(),
                        s.dout.data(), s.dq.as<float>(), s.dk.as<float>(), s.dv.as<float>());
    m.backend->synchronize();
    s.dq.download(dq, z.n);
    s.dk.download(dk, z.n_kv);
    s.dv.download(dv, z.n_v);
  }
  if (sinks) {
    std::vector<double> terms(static_cast<std::size_t>(config().shape.heads));
    kernels::sink_gradient_terms(sink_rows(m), sinks, out, dout, lse, terms.data(), 0);
    for (std::size_t h = 0; h < terms.size(); ++h) dsinks[h] = static_cast<float>(-terms[h]);
  }
}

namespace {

// The checks of a tensor reference against what the engine reads or writes there.
void check_ref(const TensorRef& t, const char* name, Memory memory, DeviceDType dtype) {
  if (!t.data) throw InputError(name, "is null");
  if (t.memory != memory)
    throw InputError(name, memory == Memory::device
                               ? "is in host memory, and this call's other tensors are on the GPU"
                               : "is in device memory, and this engine computes on the CPU");
  if (t.dtype != dtype)
    throw InputError(name,
                     std::string("must be ") + to_string(dtype) + ", got " + to_string(t.dtype));
}

}  // namespace

void Engine::forward(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                     const TensorRef& out, const TensorRef& lse, const TensorRef& sinks) {
  Impl& m = *impl_;
  check_sinks_given(m, sinks.data != nullptr, false, false);
  if (!m.on_gpu() || q.memory == Memory::host) {
    for (const auto& [t, name] :
         {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}})
      check_ref(*t, name, Memory::host, DeviceDType::fp32);
    if (sinks.data) check_ref(sinks, "sinks", Memory::host, DeviceDType::fp32);
    return forward(static_cast<const float*>(q.data), static_cast<const float*>(k.data),
                   static_cast<const float*>(v.data), static_cast<float*>(out.data),
                   static_cast<float*>(lse.data), static_cast<const float*>(sinks.data));
  }
  const DeviceDType t = dtype();
  for (const auto& [ref, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}})
    check_ref(*ref, name, Memory::device, t);
  for (const auto& [ref, name] : {std::pair{&out, "out"}, {&lse, "lse"}})
    check_ref(*ref, name, Memory::device, DeviceDType::fp32);
  if (sinks.data) check_ref(sinks, "sinks", Memory::device, DeviceDType::fp32);
  void* caller = q.stream;
  kernels::cuda::order_after(caller, m.backend->stream(), m.device_index);
  m.backend->forward(q.data, k.data, v.data, static_cast<float*>(out.data),
                     static_cast<float*>(lse.data));
  if (sinks.data)
    kernels::cuda::apply_sinks(sink_rows(m), static_cast<const float*>(sinks.data),
                               static_cast<float*>(out.data), static_cast<float*>(lse.data),
                               m.backend->stream(), m.device_index);
  kernels::cuda::order_after(m.backend->stream(), caller, m.device_index);
}

void Engine::backward(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                      const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                      const TensorRef& dq, const TensorRef& dk, const TensorRef& dv,
                      const TensorRef& sinks, const TensorRef& dsinks) {
  Impl& m = *impl_;
  check_sinks_given(m, sinks.data != nullptr, dsinks.data != nullptr, true);
  if (!m.on_gpu() || q.memory == Memory::host) {
    if (sinks.data) {
      check_ref(sinks, "sinks", Memory::host, DeviceDType::fp32);
      check_ref(dsinks, "dsinks", Memory::host, DeviceDType::fp32);
    }
    for (const auto& [t, name] : {std::pair{&q, "q"},
                                  {&k, "k"},
                                  {&v, "v"},
                                  {&out, "out"},
                                  {&lse, "lse"},
                                  {&dout, "dout"},
                                  {&dq, "dq"},
                                  {&dk, "dk"},
                                  {&dv, "dv"}})
      check_ref(*t, name, Memory::host, DeviceDType::fp32);
    return backward(static_cast<const float*>(q.data), static_cast<const float*>(k.data),
                    static_cast<const float*>(v.data), static_cast<const float*>(out.data),
                    static_cast<const float*>(lse.data), static_cast<const float*>(dout.data),
                    static_cast<float*>(dq.data), static_cast<float*>(dk.data),
                    static_cast<float*>(dv.data), static_cast<const float*>(sinks.data),
                    static_cast<float*>(dsinks.data));
  }
  const DeviceDType t = dtype();
  for (const auto& [ref, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&dout, "dout"}})
    check_ref(*ref, name, Memory::device, t);
  for (const auto& [ref, name] :
       {std::pair{&out, "out"}, {&lse, "lse"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}})
    check_ref(*ref, name, Memory::device, DeviceDType::fp32);
  if (sinks.data) {
    check_ref(sinks, "sinks", Memory::device, DeviceDType::fp32);
    check_ref(dsinks, "dsinks", Memory::device, DeviceDType::fp32);
  }
  void* caller = q.stream;
  kernels::cuda::order_after(caller, m.backend->stream(), m.device_index);
  m.backend->backward(q.data, k.data, v.data, static_cast<const float*>(out.data),
                      static_cast<const float*>(lse.data), dout.data, static_cast<float*>(dq.data),
                      static_cast<float*>(dk.data), static_cast<float*>(dv.data));
  if (sinks.data) {
    auto* ds = static_cast<float*>(dsinks.data);
    const kernels::SinkRows rows = sink_rows(m);
    if (!m.sink_workspace.data())
      m.sink_workspace =
          DeviceBuffer(std::max<std::size_t>(kernels::cuda::sink_gradient_workspace_bytes(rows), 1),
                       "the sinks' gradient workspace", m.device_index);
    kernels::cuda::sink_gradient(rows, t, static_cast<const float*>(sinks.data),
                                 static_cast<const float*>(out.data), dout.data,
                                 static_cast<const float*>(lse.data), ds,
                                 m.sink_workspace.data(), m.backend->stream(), m.device_index);
  }
  kernels::cuda::order_after(m.backend->stream(), caller, m.device_index);
}

EngineStats Engine::stats() const {
  const Impl& m = *impl_;
  const job::ResolvedJob& j = m.job;
  const int rank = m.comm.rank();
  EngineStats s;
  s.device = to_string(j.device);
  s.world_size = m.comm.size();
  s.deterministic = m.deterministic;
  s.threads = 1;
  m.backend->fill(s);
  s.layout = j.layout.name();
  s.attention_note = j.auto_note;
  if (!j.device_note.empty()) s.notes.insert(s.notes.begin(), j.device_note);
  if (!m.on_gpu()) s.blas = kernels::blas_info();
  if (j.lists) {
    const sparse::BlockLists& l = *j.lists;
    s.attended_pairs =
        sparse::attended_token_pairs(l, j.cfg) * static_cast<double>(j.cfg.shape.batch);
    s.pattern = j.pattern_text;
    s.sparsity = sparse::sparsity(l, j.cfg.causal);
    s.imbalance = ring::imbalance(sparse::attended_pairs_by_rank(l, j.layout, j.cfg));
  } else {
    s.attended_pairs = attended_pairs(j.cfg);
    s.imbalance = ring::imbalance(ring::attended_pairs_by_rank(j.cfg, j.layout));
  }
  // The ring's minimum for this rank's place in it (with Ulysses, its head slice on its
  // group's place), counted in fp32 and scaled to the device dtype K/V travel in; then the
  // all-to-alls' on top.
  const int u = j.ulysses;
  std::optional<job::UlyssesSlice> slice;
  if (u > 1) slice = job::ulysses_slice(j.cfg, j.lists, u, rank % u);
  const AttentionConfig& ring_cfg = slice ? slice->cfg : j.cfg;
  const sparse::BlockLists* ring_lists = slice ? slice->lists.get() : j.lists.get();
  int64_t ring_min = 0;
  if (j.layout.world > 1)
    ring_min = ring_lists ? sparse::minimum_bytes_sent(ring_cfg, *ring_lists, j.layout, rank / u)
                          : ring::minimum_bytes_sent(ring_cfg, j.layout, rank / u,
                                                     slice ? slice->heads : HeadSlice{});
  const int elem = m.on_gpu() ? static_cast<int>(bytes_per_element(s.dtype)) : 4;
  if (u > 1) s.bytes_sent_a2a_min = job::ulysses_forward_a2a_bytes(j.cfg, u, j.local_len(), elem);
  s.bytes_sent_min = ring_min * elem / 4 + s.bytes_sent_a2a_min;
  if (m.on_gpu()) {
    s.device_peak_bytes = device_bytes_peak();
    const CudaDeviceStatus d = probe_cuda_device(m.device_index);
    s.emulated_device = d.emulated;
    const std::string kernel =
        std::string(to_string(s.dtype)) + " inputs, kernel " + s.kernel +
        (s.kernel_backward != s.kernel ? " (backward " + s.kernel_backward + ")" : "");
    if (s.device_detail.empty())  // the GPU ring: one line per rank's device
      s.device_detail = d.name + " (sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) +
                        ") per rank, " + kernel;
    else
      s.device_detail += ", " + kernel + (m.device_comm ? " per rank" : "");
    if (m.device_comm) s.device_detail += ", " + m.device_comm->library_version();
  }
  return s;
}

}  // namespace ringattn
