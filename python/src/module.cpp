// ringattn._core: the nanobind module under the Python package. Tensors arrive through
// DLPack (torch) or the buffer protocol (numpy) without copies; each is checked here (dtype,
// device, shape, C order) with a ValueError that names the argument, then handed to the
// engine as a pointer. InputError becomes ValueError, every other failure RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "attention_op.hpp"
#include "comm_handle.hpp"
#include "group_comm.hpp"
#include "ringattn/device.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/ringattn.hpp"
#include "testing_device.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ringattn::python {
namespace {

using Array = nb::ndarray<>;

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::vector<int64_t> dims_of(const Array& a) {
  std::vector<int64_t> d;
  for (std::size_t i = 0; i < a.ndim(); ++i) d.push_back(static_cast<int64_t>(a.shape(i)));
  return d;
}

// C order, allowing any stride on dimensions of extent 1 (torch reports them freely).
bool c_contiguous(const Array& a) {
  int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

// A [B, N, H, D] view of a C-contiguous [B, H, N, D] tensor (x.transpose(1, 2)), allowing
// any stride on dimensions of extent 1.
bool head_major_view(const Array& a) {
  if (a.ndim() != 4) return false;
  const int64_t n = static_cast<int64_t>(a.shape(1)), h = static_cast<int64_t>(a.shape(2)),
                d = static_cast<int64_t>(a.shape(3));
  const int64_t want[4] = {h * n * d, d, n * d, 1};
  for (std::size_t i = 0; i < 4; ++i)
    if (a.shape(i) != 1 && a.stride(i) != want[i]) return false;
  return true;
}

// The checked float32 data of `a`, whose shape must be `want`, laid out as `layout` says.
float* floats(const Array& a, const char* name, const std::vector<int64_t>& want,
              TensorLayout layout = TensorLayout::bnhd) {
  if (a.device_type() != nb::device::cpu::value)
    throw InputError(name, "is not in host memory; this build of ringattn computes on the CPU");
  if (a.dtype() != nb::dtype<float>())
    throw InputError(name, "must be float32 (the CPU kernels compute in float32)");
  const std::vector<int64_t> got = dims_of(a);
  if (got != want)
    throw InputError(name,
                     "shape " + dims_text(got) + " does not match the expected " + dims_text(want));
  if (layout == TensorLayout::bhnd ? !head_major_view(a) : !c_contiguous(a))
    throw InputError(name, layout == TensorLayout::bhnd
                               ? "must be a [B, N, H, D] view of a contiguous [B, H, N, D] tensor "
                                 "(transpose(1, 2)), as its plan was made for"
                               : "must be contiguous in C order (the engine reads [B, N, H, D] "
                                 "rows; call .contiguous() or numpy.ascontiguousarray first)");
  return static_cast<float*>(a.data());
}

// The dtype the GPU engines read a device tensor in, by its DLPack dtype.
std::optional<DeviceDType> device_dtype_of(const Array& a) {
  const nb::dlpack::dtype t = a.dtype();
  if (t == nb::dtype<float>()) return DeviceDType::fp32;
  if (t.bits == 16 && t.lanes == 1 && t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float))
    return DeviceDType::fp16;
  if (t.bits == 16 && t.lanes == 1 &&
      t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat))
    return DeviceDType::bf16;
  return std::nullopt;
}

// A checked device tensor of a GPU engine's call: on a CUDA device, of dtype `want`, of shape
// `shape`, C-contiguous ([B, N, H, D] rows: the GPU engines read no other layout); its work
// ordered on `stream` (a cudaStream_t; 0: the legacy default stream).
TensorRef device_ref(const Array& a, const char* name, const std::vector<int64_t>& shape,
                     DeviceDType want, uintptr_t stream) {
  if (a.device_type() != nb::device::cuda::value)
    throw InputError(name, "is not on a CUDA device, and this call's engine computes on the GPU");
  const std::optional<DeviceDType> t = device_dtype_of(a);
  if (!t || *t != want)
    throw InputError(name, std::string("must be ") + to_string(want) + " as the plan was made for");
  const std::vector<int64_t> got = dims_of(a);
  if (got != shape)
    throw InputError(
        name, "shape " + dims_text(got) + " does not match the expected " + dims_text(shape));
  if (!c_contiguous(a))
    throw InputError(name, "must be contiguous (the GPU engines read [B, N, H, D] rows)");
  return {a.data(), want, Memory::device, reinterpret_cast<void*>(stream)};
}

// The shapes of a call's tensors: q and dq; k and dk; v and dv; out and dout (v's head dim
// Dv, which may differ from q's D); lse; sinks and dsinks.
struct Shapes {
  std::vector<int64_t> q, k, v, out, lse, sinks;
};

Shapes shapes_of(const AttentionOp& op) {
  const Shape4& s = op.config().shape;
  const int64_t nl = op.local_len(), hkv = op.config().effective_kv_heads();
  const int64_t dv = op.config().effective_head_dim_v();
  return {{s.batch, nl, s.heads, s.head_dim},
          {s.batch, nl, hkv, s.head_dim},
          {s.batch, nl, hkv, dv},
          {s.batch, nl, s.heads, dv},
          {s.batch, s.heads, nl},
          {s.heads}};
}

// The attention keywords both init_op and Comm.layout take, as the options the core parses.
AttentionOptions options_of(const std::string& attention,
                            std::optional<std::vector<int64_t>> segments,
                            std::optional<std::vector<int64_t>> dilations,
                            const std::string& combine, bool causal, std::optional<double> scale,
                            std::optional<std::vector<int64_t>> window,
                            std::optional<std::vector<int64_t>> seqlens,
                            std::optional<std::string> pattern, int64_t block_size, int ulysses,
                            bool deterministic) {
  AttentionOptions o;
  o.attention = attention;
  o.segments = std::move(segments);
  o.dilations = std::move(dilations);
  o.combine = combine;
  o.causal = causal;
  o.scale = scale;
  o.window = std::move(window);
  o.seqlens = std::move(seqlens);
  o.pattern = std::move(pattern);
  o.block_size = block_size;
  o.ulysses = ulysses;
  o.deterministic = deterministic;
  return o;
}

void init_op(AttentionOp* self, const Array& q, const Array& k, const std::string& attention,
             std::optional<std::vector<int64_t>> segments,
             std::optional<std::vector<int64_t>> dilations, const std::string& combine, bool causal,
             std::optional<double> scale, std::optional<std::vector<int64_t>> window,
             std::optional<std::vector<int64_t>> seqlens, std::optional<std::string> pattern,
             std::optional<Array> block_mask, int64_t block_size, int ulysses, bool deterministic,
             const CommHandle& comm, bool sinks, std::optional<int64_t> head_dim_v,
             double softcap) {
  if (q.ndim() != 4)
    throw InputError("q", "must have 4 dimensions [B, N, H, D], got " + std::to_string(q.ndim()));
  if (k.ndim() != 4)
    throw InputError("k", "must have 4 dimensions [B, N, HKV, D], got " + std::to_string(k.ndim()));
  AttentionOptions o = options_of(attention, std::move(segments), std::move(dilations), combine,
                                  causal, scale, std::move(window), std::move(seqlens),
                                  std::move(pattern), block_size, ulysses, deterministic);
  o.sinks = sinks;
  o.head_dim_v = head_dim_v;
  o.softcap = softcap;
  // q's strides say the layout (forward() checks that k, v and the outputs share it).
  if (!c_contiguous(q) && head_major_view(q)) o.layout = "bhnd";
  if (!c_contiguous(k) && head_major_view(k)) o.kv_layout = "bhnd";
  // q's device says the engine's: its GPU, in its dtype.
  if (q.device_type() == nb::device::cuda::value) {
    const std::optional<DeviceDType> t = device_dtype_of(q);
    if (!t) throw InputError("q", "a CUDA tensor must be bfloat16, float16 or float32");
    o.device = "cuda";
    o.device_index = q.device_id();
    o.dtype = to_string(*t);
  } else if (q.device_type() != nb::device::cpu::value) {
    throw InputError("q", "is neither in host memory nor on a CUDA device");
  }
  std::optional<BlockMask> mask;
  if (block_mask) {
    o.has_block_mask = true;
    const Array& m = *block_mask;
    if (m.device_type() != nb::device::cpu::value || m.dtype() != nb::dtype<bool>() ||
        !c_contiguous(m))
      throw InputError("block_mask",
                       "must be a C-ordered bool array in host memory "
                       "([H, nb, nb] or [nb, nb], nb = N / block_size)");
    mask = BlockMask{static_cast<const uint8_t*>(m.data()), dims_of(m)};
  }
  const Shape4 local{static_cast<int64_t>(q.shape(0)), static_cast<int64_t>(q.shape(1)),
                     static_cast<int64_t>(q.shape(2)), static_cast<int64_t>(q.shape(3))};
  const auto kv_heads = static_cast<int64_t>(k.shape(2));
  nb::gil_scoped_release unlocked;  // other ranks may take a while to agree
  new (self) AttentionOp(o, local, kv_heads, comm, mask);
}

}  // namespace
}  // namespace ringattn::python

NB_MODULE(_core, m) {
  using namespace ringattn;
  using namespace ringattn::python;
  // Plans cached in module-level dicts may outlive the interpreter's last collection.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, keyword_message(e).c_str());
    } catch (const RuntimeFailure& e) {
      PyErr_SetString(PyExc_RuntimeError, keyword_message(e).c_str());
    }
  });
  m.attr("__version__") = RINGATTN_VERSION;
#ifdef RINGATTN_HAVE_MPI
  m.attr("has_mpi") = true;
#else
  m.attr("has_mpi") = false;
#endif
  // CUDA kernels built into this extension (CUDA tensors then run on the GPU engines).
  m.attr("has_cuda") = cuda_built();
  m.def("shutdown", &shutdown, "Ends MPI if this process started it (atexit).");
  // The NCCL transport (GPU jobs over several processes); NCCL itself is opened only when one
  // first runs, preferring one already loaded (torch's). ringattn/_nccl.py hands over the file.
  m.attr("has_nccl") = build_features().nccl;
  m.def("set_nccl_library", &set_nccl_library, "path"_a,
        "The NCCL file to open if no NCCL is loaded when a GPU job first needs it (ringattn "
        "passes the nvidia-nccl wheel's, the one torch loads). No effect once NCCL is open.");
  m.def("nccl_version", &nccl_version,
        "The NCCL in use, opening it as a first GPU job over several processes would: "
        "'NCCL 2.28.9 (<its file>)', or why it cannot be opened.");

  nb::class_<CommHandle>(m, "CommHandle")
      .def(nb::init<double>(), "timeout"_a)
      .def_static(
          "from_torch_group",
          [](nb::object group, double timeout_s) {
            check_timeout(timeout_s);
            return CommHandle(Comm::from_transport(make_group_transport(std::move(group))),
                              timeout_s, false);
          },
          "group"_a, "timeout"_a,
          "A torch.distributed group's communicator (ringattn._comm._TorchGroup).")
      .def_static("from_mpi", &CommHandle::from_mpi, "timeout"_a,
                  nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("rank", &CommHandle::rank)
      .def_prop_ro("size", &CommHandle::size)
      .def_prop_ro("timeout", &CommHandle::timeout_s)
      .def_prop_ro("is_mpi", &CommHandle::is_mpi)
      .def("barrier", &CommHandle::barrier, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "allgather",
          [](const CommHandle& c, const Array& local, const Array& out) {
            // Raw bytes: `out` holds size() copies of `local`, rank-major.
            const std::size_t bytes = local.nbytes();
            if (!c_contiguous(local) || !c_contiguous(out))
              throw InputError("allgather", "tensors must be contiguous");
            if (out.nbytes() != bytes * static_cast<std::size_t>(c.size()))
              throw InputError("allgather", "output must hold size() copies of the input");
            nb::gil_scoped_release unlocked;
            c.allgather(local.data(), bytes, out.data());
          },
          "local"_a, "out"_a)
      .def(
          "layout",
          [](const CommHandle& c, int64_t batch, int64_t seq_len, int64_t heads,
             const std::string& attention, std::optional<std::vector<int64_t>> segments,
             std::optional<std::vector<int64_t>> dilations, const std::string& combine, bool causal,
             std::optional<double> scale, std::optional<std::vector<int64_t>> window,
             std::optional<std::vector<int64_t>> seqlens, std::optional<std::string> pattern,
             int64_t block_size, int ulysses, bool deterministic) {
            const AttentionOptions o =
                options_of(attention, std::move(segments), std::move(dilations), combine, causal,
                           scale, std::move(window), std::move(seqlens), std::move(pattern),
                           block_size, ulysses, deterministic);
            // Per rank, the (first position, length) runs it owns, in local order.
            std::vector<std::vector<std::pair<int64_t, int64_t>>> all;
            for (const std::vector<int64_t>& rows :
                 rows_for(o, {batch, seq_len, heads, 1}, c.size())) {
              all.emplace_back();
              for (std::size_t i = 0; i < rows.size();) {
                std::size_t j = i + 1;
                while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
                all.back().push_back({rows[i], static_cast<int64_t>(j - i)});
                i = j;
              }
            }
            return all;
          },
          "batch"_a, "seq_len"_a, "heads"_a, "attention"_a, "segments"_a.none(),
          "dilations"_a.none(), "combine"_a, "causal"_a, "scale"_a.none(), "window"_a.none(),
          "seqlens"_a.none(), "pattern"_a.none(), "block_size"_a, "ulysses"_a,
          "deterministic"_a = false);

  nb::class_<AttentionOp>(m, "AttentionOp")
      .def("__init__", &init_op, "q"_a, "k"_a, "attention"_a, "segments"_a.none(),
           "dilations"_a.none(), "combine"_a, "causal"_a, "scale"_a.none(), "window"_a.none(),
           "seqlens"_a.none(), "pattern"_a.none(), "block_mask"_a.none(), "block_size"_a,
           "ulysses"_a, "deterministic"_a, "comm"_a, "sinks"_a = false,
           "head_dim_v"_a.none() = nb::none(), "softcap"_a = 0.0)
      .def_prop_ro("engine", &AttentionOp::engine)
      .def_prop_ro("local_len", [](const AttentionOp& op) { return op.local_len(); })
      .def_prop_ro("seq_len", [](const AttentionOp& op) { return op.config().shape.seq_len; })
      .def_prop_ro("kv_heads",
                   [](const AttentionOp& op) { return op.config().effective_kv_heads(); })
      .def_prop_ro("scale", [](const AttentionOp& op) { return op.config().effective_scale(); })
      .def_prop_ro("head_dim_v",
                   [](const AttentionOp& op) { return op.config().effective_head_dim_v(); })
      .def_prop_ro("softcap", [](const AttentionOp& op) { return op.config().softcap; })
      .def_prop_ro("layout",
                   [](const AttentionOp& op) { return std::string(to_string(op.config().layout)); })
      .def_prop_ro("kv_layout",
                   [](const AttentionOp& op) {
                     return std::string(to_string(op.config().effective_kv_layout()));
                   })
      .def_prop_ro("device",
                   [](const AttentionOp& op) { return std::string(op.on_gpu() ? "cuda" : "cpu"); })
      .def(
          "forward",
          [](AttentionOp& op, const Array& q, const Array& k, const Array& v, const Array& out,
             const Array& lse, const std::optional<Array>& sinks, uintptr_t stream) {
            const Shapes s = shapes_of(op);
            if (op.on_gpu()) {
              const DeviceDType t = op.dtype();
              const TensorRef tq = device_ref(q, "q", s.q, t, stream),
                              tk = device_ref(k, "k", s.k, t, stream),
                              tv = device_ref(v, "v", s.v, t, stream),
                              to = device_ref(out, "out", s.out, DeviceDType::fp32, stream),
                              tl = device_ref(lse, "lse", s.lse, DeviceDType::fp32, stream),
                              ts = sinks ? device_ref(*sinks, "sinks", s.sinks, DeviceDType::fp32,
                                                      stream)
                                         : TensorRef{};
              nb::gil_scoped_release unlocked;
              return op.forward(tq, tk, tv, to, tl, ts);
            }
            const TensorLayout l = op.config().layout, lkv = op.config().effective_kv_layout();
            const float* pq = floats(q, "q", s.q, l);
            const float* pk = floats(k, "k", s.k, lkv);
            const float* pv = floats(v, "v", s.v, lkv);
            float* po = floats(out, "out", s.out, l);
            float* pl = floats(lse, "lse", s.lse);
            const float* ps = sinks ? floats(*sinks, "sinks", s.sinks) : nullptr;
            nb::gil_scoped_release unlocked;
            op.forward(pq, pk, pv, po, pl, ps);
          },
          "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "sinks"_a = nb::none(), "stream"_a = 0)
      .def(
          "backward",
          [](AttentionOp& op, const Array& q, const Array& k, const Array& v, const Array& out,
             const Array& lse, const Array& dout, const Array& dq, const Array& dk, const Array& dv,
             const std::optional<Array>& sinks, const std::optional<Array>& dsinks,
             uintptr_t stream) {
            const Shapes s = shapes_of(op);
            if (op.on_gpu()) {
              const DeviceDType t = op.dtype(), f = DeviceDType::fp32;
              const TensorRef tq = device_ref(q, "q", s.q, t, stream),
                              tk = device_ref(k, "k", s.k, t, stream),
                              tv = device_ref(v, "v", s.v, t, stream),
                              to = device_ref(out, "out", s.out, f, stream),
                              tl = device_ref(lse, "lse", s.lse, f, stream),
                              td = device_ref(dout, "grad_output", s.out, t, stream),
                              tdq = device_ref(dq, "dq", s.q, f, stream),
                              tdk = device_ref(dk, "dk", s.k, f, stream),
                              tdv = device_ref(dv, "dv", s.v, f, stream),
                              ts = sinks ? device_ref(*sinks, "sinks", s.sinks, f, stream)
                                         : TensorRef{},
                              tds = dsinks ? device_ref(*dsinks, "dsinks", s.sinks, f, stream)
                                           : TensorRef{};
              nb::gil_scoped_release unlocked;
              return op.backward(tq, tk, tv, to, tl, td, tdq, tdk, tdv, ts, tds);
            }
            const TensorLayout l = op.config().layout, lkv = op.config().effective_kv_layout();
            const float* pq = floats(q, "q", s.q, l);
            const float* pk = floats(k, "k", s.k, lkv);
            const float* pv = floats(v, "v", s.v, lkv);
            const float* po = floats(out, "out", s.out, l);
            const float* pl = floats(lse, "lse", s.lse);
            const float* pd = floats(dout, "grad_output", s.out, l);
            float* pdq = floats(dq, "dq", s.q, l);
            float* pdk = floats(dk, "dk", s.k, lkv);
            float* pdv = floats(dv, "dv", s.v, lkv);
            const float* ps = sinks ? floats(*sinks, "sinks", s.sinks) : nullptr;
            float* pds = dsinks ? floats(*dsinks, "dsinks", s.sinks) : nullptr;
            nb::gil_scoped_release unlocked;
            op.backward(pq, pk, pv, po, pl, pd, pdq, pdk, pdv, ps, pds);
          },
          "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a,
          "sinks"_a = nb::none(), "dsinks"_a = nb::none(), "stream"_a = 0);
  register_testing_device_arrays(m);
}
