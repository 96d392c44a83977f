// cuDNN fused SDPA forward through the backend API (see cudnn_sdpa.hpp). cuDNN is loaded
// with dlopen, once; plans are built per view at plan time and executed with a fresh
// variant pack per call (the pointers change). Plan-time failures become CudnnUnavailable,
// so the caller falls back to the native kernels; run-time failures are RuntimeFailures.
#include "kernels/cuda/cudnn_sdpa.hpp"

#include <cudnn.h>
#include <dlfcn.h>

#include <array>
#include <mutex>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

// The cuDNN entry points used here, resolved from the shared library at run time.
struct CudnnApi {
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnGetLastErrorString) GetLastErrorString = nullptr;  // may be absent
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;
  std::string error;  // non-empty: the library could not be loaded
};

// CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR exists from cuDNN 9.13 on; an older library
// fails on it with an opaque descriptor error, so the version is checked first.
constexpr std::size_t kUnifiedSdpaVersion = 91300;

// cudnnGetVersion() since 9.0: major·10000 + minor·100 + patch.
std::string version_text(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

template <typename F>
void resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
}

const CudnnApi& api() {
  static CudnnApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = nullptr;
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) {
      const char* why = dlerror();
      a.error = std::string("cannot load libcudnn.so.9: ") + (why ? why : "not found");
      return;
    }
    std::string missing;
    resolve(lib, "cudnnGetVersion", a.GetVersion, missing);
    resolve(lib, "cudnnCreate", a.Create, missing);
    resolve(lib, "cudnnDestroy", a.Destroy, missing);
    resolve(lib, "cudnnSetStream", a.SetStream, missing);
    resolve(lib, "cudnnGetErrorString", a.GetErrorString, missing);
    resolve(lib, "cudnnBackendCreateDescriptor", a.CreateDescriptor, missing);
    resolve(lib, "cudnnBackendDestroyDescriptor", a.DestroyDescriptor, missing);
    resolve(lib, "cudnnBackendSetAttribute", a.SetAttribute, missing);
    resolve(lib, "cudnnBackendGetAttribute", a.GetAttribute, missing);
    resolve(lib, "cudnnBackendFinalize", a.Finalize, missing);
    resolve(lib, "cudnnBackendExecute", a.Execute, missing);
    if (!missing.empty()) {
      a.error = "libcudnn lacks " + missing;
      return;
    }
    std::string optional;
    resolve(lib, "cudnnGetLastErrorString", a.GetLastErrorString, optional);
    if (a.GetVersion() < kUnifiedSdpaVersion)
      a.error = "cuDNN " + version_text(a.GetVersion()) +
                " is older than 9.13, the first with the unified SDPA operation this path "
                "uses (upgrade cuDNN to use it)";
  });
  return a;
}

[[noreturn]] void throw_cudnn_error(cudnnStatus_t s, const char* what, const char* file, int line) {
  const CudnnApi& a = api();
  std::string msg = std::string("cuDNN error at ") + file + ":" + std::to_string(line) + ": " +
                    what + ": " + a.GetErrorString(s);
  if (a.GetLastErrorString) {
    char detail[512] = {};
    a.GetLastErrorString(detail, sizeof detail);
    if (detail[0]) msg += std::string(" (") + detail + ")";
  }
  throw RuntimeFailure(msg);
}

#define RINGATTN_CUDNN_CHECK(expr)                                          \
  do {                                                                      \
    const cudnnStatus_t ringattn_cudnn_status_ = (expr);                    \
    if (ringattn_cudnn_status_ != CUDNN_STATUS_SUCCESS)                     \
      throw_cudnn_error(ringattn_cudnn_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// An owned backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    RINGATTN_CUDNN_CHECK(api().CreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) (void)api().DestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* addr() { return &d_; }

  template <typename T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const T* values) {
    RINGATTN_CUDNN_CHECK(api().SetAttribute(d_, name, type, count, values));
  }
  void set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() { RINGATTN_CUDNN_CHECK(api().Finalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

Desc tensor(int64_t uid, cudnnDataType_t type, const std::array<int64_t, 4>& dims,
            const std::array<int64_t, 4>& strides, bool by_value = false) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  const int64_t alignment = by_value ? 4 : 16;
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  if (by_value) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  t.finalize();
  return t;
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale };

// One strided view of the problem and the cuDNN plan that runs it.
struct View {
  ViewResultParams place;   // where its rows go in out/lse (pointers filled per call)
  int64_t elem_offset = 0;  // of its first element in q/k/v/o ([B, N, H, D])
  int64_t stats_rows = 0;
  // The execution plan refers to its engine configuration, operation graph, operation and
  // tensor descriptors: they are kept for the plan's life (destroyed after it: the plan is
  // declared last, so it goes first).
  std::vector<Desc> plan_inputs;
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
};

// The views of a configuration (docs/SEMANTICS.md): dense is one; grouped one per head
// group; mixture one per (pattern, offset class of heads).
std::vector<View> views_of(const AttentionConfig& cfg) {
  if (cfg.attention == AttentionKind::dilated && (cfg.head_base != 0 || cfg.global_heads))
    throw CudnnUnavailable("a head slice of a dilated job (Ulysses) runs on the native kernels");
  const Shape4& s = cfg.shape;
  const std::vector<DilatedPattern> pats = patterns_of(cfg);
  const auto G = static_cast<int64_t>(pats.size());
  std::vector<View> views;
  auto add = [&](const DilatedPattern& p, int64_t offset, int64_t first_head, int64_t count,
                 int64_t step, bool accumulate, float out_scale) {
    const int64_t m = selected_per_segment(p, offset);
    if (m == 0 || count == 0) return;
    View v;
    ViewResultParams& r = v.place;
    r.batch = s.batch;
    r.seq_len = s.seq_len;
    r.heads = s.heads;
    r.head_dim = s.head_dim;
    r.segment = p.segment;
    r.dilation = p.dilation;
    r.offset = offset;
    r.rows = m;
    r.first_head = first_head;
    r.head_count = count;
    r.head_step = step;
    r.accumulate = accumulate;
    r.out_scale = out_scale;
    v.elem_offset = (offset * s.heads + first_head) * s.head_dim;
    v.stats_rows = s.batch * (s.seq_len / p.segment) * count * m;
    views.push_back(std::move(v));
  };
  if (cfg.attention == AttentionKind::dense || cfg.combine == Combine::grouped) {
    for (int64_t g = 0; g < G; ++g) {
      const HeadRange hr = group_heads(s.heads, G, g);
      add(pats[static_cast<std::size_t>(g)], pattern_offset(cfg, g, hr.first), hr.first, hr.count,
          1, false, 1.0f / static_cast<float>(G));
    }
  } else {
    for (int64_t i = 0; i < G; ++i) {
      const DilatedPattern& p = pats[static_cast<std::size_t>(i)];
      for (int64_t o = 0; o < std::min(p.dilation, s.heads); ++o)
        add(p, o, o, (s.heads - o + p.dilation - 1) / p.dilation, p.dilation, true, 1.0f);
    }
  }
  return views;
}

// An owned cuDNN handle: released on every path, also when building the plans throws.
class Handle {
 public:
  Handle() { RINGATTN_CUDNN_CHECK(api().Create(&h_)); }
  ~Handle() {
    if (h_) (void)api().Destroy(h_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  cudnnHandle_t h_ = nullptr;
};

class CudnnSdpaImpl final : public CudnnSdpa {
 public:
  CudnnSdpaImpl(const AttentionConfig& cfg, Elem e, int device, cudaStream_t stream)
      : cfg_(cfg), elem_(e) {
    const CudnnApi& a = api();
    cudnnHandle_t handle = handle_.get();
    RINGATTN_CUDNN_CHECK(a.SetStream(handle, stream));
    const Shape4& s = cfg.shape;
    const cudnnDataType_t type = e == Elem::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const int64_t H = s.heads, D = s.head_dim;
    views_ = views_of(cfg);
    // The scratch tensors first: when they do not fit, fail before the (seconds long) plan
    // building.
    int64_t max_stats = 0, max_ws = 0;
    for (const View& v : views_) max_stats = std::max(max_stats, v.stats_rows);
    const std::size_t o_bytes = static_cast<std::size_t>(s.numel()) * (e == Elem::fp32 ? 4 : 2);
    o_scratch_ = DeviceAllocation(o_bytes, "the cuDNN output scratch", device, stream);
    stats_ = DeviceAllocation(static_cast<std::size_t>(max_stats) * sizeof(float),
                              "the cuDNN softmax stats", device, stream);
    for (View& v : views_) {
      const ViewResultParams& r = v.place;
      const int64_t bs = s.batch * (s.seq_len / r.segment);
      // [B·S, Hg, m, D]: segments w·H·D apart, heads step·D, rows r·H·D, columns 1.
      const std::array<int64_t, 4> dims{bs, r.head_count, r.rows, D};
      const std::array<int64_t, 4> strides{r.segment * H * D, r.head_step * D, r.dilation * H * D,
                                           1};
      const std::array<int64_t, 4> stat_dims{bs, r.head_count, r.rows, 1};
      const std::array<int64_t, 4> stat_strides{r.head_count * r.rows, r.rows, 1, 1};
      Desc q = tensor(kQ, type, dims, strides), k = tensor(kK, type, dims, strides),
           vv = tensor(kV, type, dims, strides), o = tensor(kO, type, dims, strides),
           stats = tensor(kStats, CUDNN_DATA_FLOAT, stat_dims, stat_strides),
           scale = tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
      Desc op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, vv);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats);
      op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale);
      op.finalize();
      Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
      graph.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
      graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      graph.finalize();
      Desc engine_cfg = best_plan(graph, v.plan);
      for (Desc* d : {&q, &k, &vv, &o, &stats, &scale, &op, &graph, &engine_cfg})
        v.plan_inputs.push_back(std::move(*d));
      RINGATTN_CUDNN_CHECK(a.GetAttribute(v.plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, nullptr, &v.workspace));
      max_ws = std::max(max_ws, v.workspace);
    }
    workspace_ =
        DeviceAllocation(static_cast<std::size_t>(max_ws), "the cuDNN workspace", device, stream);
    version_ = api().GetVersion();
  }

  ~CudnnSdpaImpl() override = default;  // views_ (plans) go before handle_ (declared first)

  void forward(const void* q, const void* k, const void* v, float* out, float* lse,
               cudaStream_t stream) override {
    const CudnnApi& a = api();
    RINGATTN_CUDNN_CHECK(a.SetStream(handle_.get(), stream));
    const int64_t bytes = elem_ == Elem::fp32 ? 4 : 2;
    const float scale = static_cast<float>(cfg_.effective_scale());
    auto at = [&](const void* base, int64_t elems) {
      return const_cast<char*>(static_cast<const char*>(base)) + elems * bytes;
    };
    for (const View& view : views_) {
      std::array<int64_t, 6> uids{kQ, kK, kV, kO, kStats, kScale};
      std::array<void*, 6> ptrs{at(q, view.elem_offset),
                                at(k, view.elem_offset),
                                at(v, view.elem_offset),
                                at(o_scratch_.get(), view.elem_offset),
                                stats_.get(),
                                const_cast<float*>(&scale)};
      void* ws = workspace_.get();
      Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 6, uids.data());
      pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 6, ptrs.data());
      pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
      pack.finalize();
      RINGATTN_CUDNN_CHECK(a.Execute(handle_.get(), view.plan->get(), pack.get()));
      ViewResultParams r = view.place;
      r.o_scratch = o_scratch_.get();
      r.stats = stats_.as<float>();
      r.out = out;
      r.lse = lse;
      launch_store_view_result(elem_, r, stream);
    }
  }

  std::size_t workspace_bytes() const override {
    return o_scratch_.bytes() + stats_.bytes() + workspace_.bytes();
  }

  std::string description() const override {
    return "cuDNN " + version_text(version_) + ", " + std::to_string(views_.size()) + " views";
  }

 private:
  // The first engine configuration of heuristics mode A whose plan finalises: the plan goes
  // to `plan`, its engine configuration is returned (the plan refers to it).
  Desc best_plan(Desc& graph, std::unique_ptr<Desc>& plan_out) {
    const CudnnApi& a = api();
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heur.finalize();
    int64_t count = 0;
    RINGATTN_CUDNN_CHECK(a.GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    if (count <= 0) throw CudnnUnavailable("no cuDNN engine supports this SDPA graph");
    std::vector<Desc> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    int64_t got = 0;
    RINGATTN_CUDNN_CHECK(a.GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
    std::string last_error;
    for (int64_t i = 0; i < got; ++i) {
      auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      cudnnHandle_t handle = handle_.get();
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[static_cast<std::size_t>(i)]);
      const cudnnStatus_t st = a.Finalize(plan->get());
      if (st == CUDNN_STATUS_SUCCESS) {
        plan_out = std::move(plan);
        return std::move(configs[static_cast<std::size_t>(i)]);
      }
      last_error = a.GetErrorString(st);
    }
    throw CudnnUnavailable("none of " + std::to_string(got) +
                           " cuDNN engine configurations finalised (last: " + last_error + ")");
  }

  AttentionConfig cfg_;
  Elem elem_;
  Handle handle_;  // before views_: destroyed after every plan made with it
  std::vector<View> views_;
  DeviceAllocation o_scratch_, stats_, workspace_;
  std::size_t version_ = 0;
};

}  // namespace

std::unique_ptr<CudnnSdpa> CudnnSdpa::create(const AttentionConfig& cfg, Elem e, int device,
                                             cudaStream_t stream) {
  if (e == Elem::fp32) throw CudnnUnavailable("cuDNN SDPA takes bf16 or fp16 inputs, not fp32");
  if (cfg.causal)
    throw CudnnUnavailable(
        "the unified SDPA operation has no causal mask; causal runs on the native kernels");
  if (cfg.effective_kv_heads() != cfg.shape.heads)
    throw CudnnUnavailable("grouped-query attention runs on the native kernels");
  if (cfg.windowed()) throw CudnnUnavailable("a sliding window runs on the native kernels");
  if (cfg.packed()) throw CudnnUnavailable("packed sequences run on the native kernels");
  if (cfg.shape.head_dim % 8 != 0 || cfg.shape.head_dim > 256)
    throw CudnnUnavailable("head dim " + std::to_string(cfg.shape.head_dim) +
                           " is not a multiple of 8 up to 256");
  const CudnnApi& a = api();
  if (!a.error.empty()) throw CudnnUnavailable(a.error);
  try {
    return std::make_unique<CudnnSdpaImpl>(cfg, e, device, stream);
  } catch (const CudnnUnavailable&) {
    throw;
  } catch (const DeviceOutOfMemory&) {
    throw;  // the caller decides (CudaPlan falls back to native with a note)
  } catch (const RuntimeFailure& err) {
    throw CudnnUnavailable(err.what());  // a descriptor or engine cuDNN refuses: use native
  }
}

}  // namespace ringattn::kernels::cuda
