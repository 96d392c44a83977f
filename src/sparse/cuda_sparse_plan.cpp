// CudaSparsePlan (see cuda_sparse_plan.hpp): the single-device block-sparse lists, uploaded
// once, run by the block-sparse CUDA kernels (kernels/cuda/sparse_params.hpp) on one stream.
#include "sparse/cuda_sparse_plan.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "kernels/cuda/sparse_params.hpp"
#include "ringattn/errors.hpp"
#include "sparse/single_device_lists.hpp"

namespace ringattn::sparse {

namespace kc = kernels::cuda;

namespace {

kc::Elem elem_of(DeviceDType t) {
  switch (t) {
    case DeviceDType::bf16:
      return kc::Elem::bf16;
    case DeviceDType::fp16:
      return kc::Elem::fp16;
    case DeviceDType::fp32:
      return kc::Elem::fp32;
  }
  return kc::Elem::bf16;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
kc::DeviceAllocation upload_vector(const std::vector<T>& v, const char* what, int device,
                                   cudaStream_t stream) {
  kc::DeviceAllocation a(v.size() * sizeof(T), what, device, stream);
  if (!v.empty())
    RINGATTN_CUDA_CHECK(
        cudaMemcpyAsync(a.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return a;
}

// 16-byte copies need every row start and stride the kernels use to be a multiple of 8
// elements (the tensors' own pointers are checked at each call).
bool rows_aligned(const SingleDeviceWork& w) {
  auto ok = [](int64_t x) { return x % 8 == 0; };
  if (!ok(w.q_stride)) return false;
  for (const auto& t : w.q_tiles)
    if (!ok(t.q_row0)) return false;
  for (const auto& s : w.key_spans)
    if (!ok(s.k_row0) || !ok(s.k_stride)) return false;
  for (const auto& t : w.k_tiles)
    if (!ok(t.k_row0) || !ok(t.k_stride)) return false;
  for (const auto& s : w.query_spans)
    if (!ok(s.q_row0)) return false;
  return true;
}

}  // namespace

struct CudaSparsePlan::Impl {
  AttentionConfig cfg;
  std::shared_ptr<const BlockLists> lists;
  CudaPlanOptions opts;
  kc::Elem elem = kc::Elem::bf16;
  CudaDeviceStatus device;
  cudaStream_t stream = nullptr;
  int64_t q_stride = 0, lse_stride = 1;
  int64_t n_q_items = 0, n_k_items = 0;
  kc::DeviceAllocation q_tiles, key_spans, k_tiles, query_spans, q_items, k_items, delta;
  bool vector_loads = false;
  std::vector<std::string> notes;

  ~Impl() {
    const kc::ScopedDevice on(opts.device, std::nothrow);
    for (kc::DeviceAllocation* a :
         {&q_tiles, &key_spans, &k_tiles, &query_spans, &q_items, &k_items, &delta})
      a->reset();
    if (stream) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
    }
    kc::release_unused_device_memory(opts.device);
  }
};

CudaSparsePlan::CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                               CudaPlanOptions opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg);
  if (cfg.attention != AttentionKind::block_sparse)
    throw std::invalid_argument("CudaSparsePlan: the configuration is not block-sparse");
  if (opts.kernel == KernelChoice::cudnn)
    throw InputError("--kernel", "'cudnn' has no block-sparse kernel; use --kernel native or auto");
  Impl& m = *impl_;
  m.cfg = cfg;
  m.lists = std::move(lists);
  m.opts = opts;
  m.elem = elem_of(opts.dtype);
  m.device = probe_cuda_device(opts.device);
  if (!m.device.usable) throw InputError("--device", "'cuda' cannot be used: " + m.device.reason);
  const kc::ScopedDevice on(opts.device);
  if (m.elem != kc::Elem::fp32) {
    const std::string why = kc::sparse_kernels_fit(cfg.shape.head_dim, m.elem, opts.device);
    if (!why.empty()) {
      m.notes.push_back(why + "; running the fp32 kernels instead");
      m.opts.dtype = DeviceDType::fp32;
      m.elem = kc::Elem::fp32;
    }
  }
  RINGATTN_CUDA_CHECK(cudaStreamCreate(&m.stream));

  // Device blocks own kQueryTile query rows (kKeyTile key rows); CPU tiles are one block of
  // any size, so items cut them into such pieces. A block smaller than 64 rows leaves part
  // of its device block idle: merging several query blocks into one device tile would need a
  // per-row mask, since neighbouring blocks list different keys.
  static_assert(kc::kQueryTile == kc::kKeyTile, "one item size for both passes");
  const SingleDeviceWork w = build_single_device_work(cfg, *m.lists, kc::kQueryTile);
  m.q_stride = w.q_stride;
  m.lse_stride = w.lse_stride;
  m.n_q_items = static_cast<int64_t>(w.q_items.size());
  m.n_k_items = static_cast<int64_t>(w.k_items.size());
  const int dev = opts.device;
  m.q_tiles = upload_vector(w.q_tiles, "the block-sparse query tiles", dev, m.stream);
  m.key_spans = upload_vector(w.key_spans, "the block-sparse key spans", dev, m.stream);
  m.k_tiles = upload_vector(w.k_tiles, "the block-sparse key tiles", dev, m.stream);
  m.query_spans = upload_vector(w.query_spans, "the block-sparse query spans", dev, m.stream);
  m.q_items = upload_vector(w.q_items, "the block-sparse query work items", dev, m.stream);
  m.k_items = upload_vector(w.k_items, "the block-sparse key work items", dev, m.stream);
  const Shape4& s = cfg.shape;
  m.delta =
      kc::DeviceAllocation(static_cast<std::size_t>(s.batch * s.heads * s.seq_len) * sizeof(float),
                           "the backward's row sums D = rowsum(out * dout)", dev, m.stream);
  m.vector_loads =
      m.elem != kc::Elem::fp32 && s.head_dim == kc::padded_head_dim(s.head_dim) && rows_aligned(w);
  if (opts.kernel == KernelChoice::automatic)
    m.notes.push_back("--kernel auto: the native block-sparse kernels (cuDNN has none)");
  // The host lists go out of scope: the copies must have landed.
  RINGATTN_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

CudaSparsePlan::~CudaSparsePlan() = default;
CudaSparsePlan::CudaSparsePlan(CudaSparsePlan&&) noexcept = default;
CudaSparsePlan& CudaSparsePlan::operator=(CudaSparsePlan&&) noexcept = default;

const AttentionConfig& CudaSparsePlan::config() const noexcept { return impl_->cfg; }
DeviceDType CudaSparsePlan::dtype() const noexcept { return impl_->opts.dtype; }
const std::vector<std::string>& CudaSparsePlan::notes() const noexcept { return impl_->notes; }

std::size_t CudaSparsePlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t b = 0;
  for (const kc::DeviceAllocation* a :
       {&m.q_tiles, &m.key_spans, &m.k_tiles, &m.query_spans, &m.q_items, &m.k_items, &m.delta})
    b += a->bytes();
  return b;
}

std::string CudaSparsePlan::device_description() const {
  const CudaDeviceStatus& d = impl_->device;
  return d.name + " (sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) + ")";
}

void CudaSparsePlan::synchronize() {
  const kc::ScopedDevice on(impl_->opts.device);
  RINGATTN_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void CudaSparsePlan::forward(const void* q, const void* k, const void* v, float* out, float* lse) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  kc::SparseForwardParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.tiles = m.q_tiles.as<kernels::SparseQueryTile>();
  p.spans = m.key_spans.as<kernels::KeySpan>();
  p.items = m.q_items.as<kernels::ForwardItem>();
  p.n_items = m.n_q_items;
  p.q_stride = m.q_stride;
  p.lse_stride = m.lse_stride;
  p.head_dim = static_cast<int>(m.cfg.shape.head_dim);
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.causal = m.cfg.causal;
  p.accumulate = false;  // every row has exactly one query tile: written, not merged
  p.vector_loads = m.vector_loads && aligned16(q) && aligned16(k) && aligned16(v);
  kc::sparse_forward(m.elem, p, m.stream);
}

void CudaSparsePlan::backward(const void* q, const void* k, const void* v, const float* out,
                              const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  const Shape4& s = m.cfg.shape;
  const std::size_t bytes = static_cast<std::size_t>(s.numel()) * sizeof(float);
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dq, 0, bytes, m.stream));
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dk, 0, bytes, m.stream));
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dv, 0, bytes, m.stream));
  kc::RowDotParams rd;
  rd.out = out;
  rd.dout = dout;
  rd.delta = m.delta.as<float>();
  rd.batch = s.batch;
  rd.seq_len = s.seq_len;
  rd.heads = s.heads;
  rd.head_dim = s.head_dim;
  kc::launch_row_dot(m.elem, rd, m.stream);

  kc::SparseBackwardParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.dout = dout;
  p.lse = lse;
  p.delta = m.delta.as<float>();
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.q_tiles = m.q_tiles.as<kernels::SparseQueryTile>();
  p.key_spans = m.key_spans.as<kernels::KeySpan>();
  p.q_items = m.q_items.as<kernels::ForwardItem>();
  p.n_q_items = m.n_q_items;
  p.k_tiles = m.k_tiles.as<kernels::SparseKeyTile>();
  p.query_spans = m.query_spans.as<kernels::QuerySpan>();
  p.k_items = m.k_items.as<kernels::ForwardItem>();
  p.n_k_items = m.n_k_items;
  p.q_stride = m.q_stride;
  p.lse_stride = m.lse_stride;
  p.head_dim = static_cast<int>(s.head_dim);
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.causal = m.cfg.causal;
  p.vector_loads =
      m.vector_loads && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
  kc::sparse_backward(m.elem, p, m.stream);
}

}  // namespace ringattn::sparse
