// GPU benchmark of one configuration: builds a CudaPlan, fills q/k/v/dout on the device
// with a counter-based hash (uniform, unit variance; no host copies, so the largest N fits),
// then times forward and backward with CUDA events: warm-up runs, then the median of many.
// Prints one JSON object per pass on stdout (bench/gpu/run_bench.py collects them).
// With --max-n it instead finds the largest N whose dilated forward fits on the device and
// compares it with the bound that memory for q, k, v, out and lse alone allows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/runtime/cuda_check.hpp"
#include "ringattn/config.hpp"
#include "ringattn/errors.hpp"
#include "single/cuda_plan.hpp"

namespace {

using namespace ringattn;

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * 0x1.0p-24f;  // [0, 1)
    p[i] = T((2.0f * u - 1.0f) * 1.7320508f);
  }
}

void fill(void* p, int64_t n, DeviceDType t, uint64_t seed) {
  const unsigned blocks = 1024;
  if (t == DeviceDType::bf16)
    fill_kernel<<<blocks, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  else if (t == DeviceDType::fp16)
    fill_kernel<<<blocks, 256>>>(static_cast<__half*>(p), n, seed);
  else
    fill_kernel<<<blocks, 256>>>(static_cast<float*>(p), n, seed);
  RINGATTN_CUDA_CHECK_LAUNCH("fill_kernel");
}

struct Args {
  AttentionConfig cfg;
  DeviceDType dtype = DeviceDType::bf16;
  KernelChoice kernel = KernelChoice::native;
  bool fwd = true, bwd = true, max_n = false;
  int warmup = 2, iters = 10;
};

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::stoll(x));
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  a.cfg.shape = {1, 16384, 16, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(k, "needs a value");
      return argv[++i];
    };
    if (k == "--batch")
      a.cfg.shape.batch = std::stoll(val());
    else if (k == "--seq-len")
      a.cfg.shape.seq_len = std::stoll(val());
    else if (k == "--heads")
      a.cfg.shape.heads = std::stoll(val());
    else if (k == "--head-dim")
      a.cfg.shape.head_dim = std::stoll(val());
    else if (k == "--attention")
      a.cfg.attention = val() == "dilated" ? AttentionKind::dilated : AttentionKind::dense;
    else if (k == "--combine")
      a.cfg.combine = val() == "mixture" ? Combine::mixture : Combine::grouped;
    else if (k == "--segments")
      a.cfg.segments = ints(val());
    else if (k == "--dilations")
      a.cfg.dilations = ints(val());
    else if (k == "--causal")
      a.cfg.causal = true;
    else if (k == "--dtype") {
      const std::string t = val();
      a.dtype = t == "fp16"   ? DeviceDType::fp16
                : t == "fp32" ? DeviceDType::fp32
                              : DeviceDType::bf16;
    } else if (k == "--kernel") {
      const std::string t = val();
      a.kernel = t == "cudnn"    ? KernelChoice::cudnn
                 : t == "auto"   ? KernelChoice::automatic
                 : t == "hopper" ? KernelChoice::hopper
                                 : KernelChoice::native;
    } else if (k == "--pass") {
      const std::string t = val();
      a.fwd = t != "bwd";
      a.bwd = t != "fwd";
    } else if (k == "--warmup")
      a.warmup = std::stoi(val());
    else if (k == "--iters")
      a.iters = std::stoi(val());
    else if (k == "--max-n")
      a.max_n = true;
    else
      throw InputError(k, "unknown option (see the head of bench/gpu/gpu_bench.cu)");
  }
  return a;
}

std::string device_name() {
  const CudaDeviceStatus s = probe_cuda_device();
  return s.usable ? s.name : "none";
}

nlohmann::json row_base(const Args& a, const std::string& impl) {
  const Shape4& s = a.cfg.shape;
  nlohmann::json j;
  j["device"] = device_name();
  j["impl"] = impl;
  j["attention"] = a.cfg.attention == AttentionKind::dense ? "dense" : "dilated";
  if (a.cfg.attention == AttentionKind::dilated) {
    j["combine"] = to_string(a.cfg.combine);
    j["segments"] = a.cfg.segments;
    j["dilations"] = a.cfg.dilations;
  }
  j["causal"] = a.cfg.causal;
  j["head_dim"] = s.head_dim;
  j["seq_len"] = s.seq_len;
  j["batch"] = s.batch;
  j["heads"] = s.heads;
  j["dtype"] = to_string(a.dtype);
  return j;
}

// Median and every time of a.iters runs of `f` after a.warmup, with CUDA events on the
// legacy stream (which the plans' blocking streams and the null stream order against).
template <class F>
std::pair<double, std::vector<double>> time_ms(const Args& a, F&& f) {
  cudaEvent_t e0, e1;
  RINGATTN_CUDA_CHECK(cudaEventCreate(&e0));
  RINGATTN_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < a.warmup; ++i) f();
  RINGATTN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < a.iters; ++i) {
    RINGATTN_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    f();
    RINGATTN_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    RINGATTN_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    RINGATTN_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  return {sorted[sorted.size() / 2], ms};
}

int bench(const Args& a) {
  const Shape4& s = a.cfg.shape;
  CudaPlan plan(a.cfg, {a.dtype, a.kernel, 0});
  const auto n = static_cast<std::size_t>(s.numel());
  const auto nl = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  const std::size_t in_bytes = n * bytes_per_element(a.dtype);
  DeviceBuffer q(in_bytes, "q"), k(in_bytes, "k"), v(in_bytes, "v");
  DeviceBuffer out(n * 4, "out"), lse(nl * 4, "lse");
  fill(q.data(), static_cast<int64_t>(n), a.dtype, 1);
  fill(k.data(), static_cast<int64_t>(n), a.dtype, 2);
  fill(v.data(), static_cast<int64_t>(n), a.dtype, 3);
  RINGATTN_CUDA_CHECK(cudaDeviceSynchronize());
  DeviceBuffer dout, dq, dk, dv;
  if (a.bwd) {
    dout = DeviceBuffer(in_bytes, "dout");
    dq = DeviceBuffer(n * 4, "dq");
    dk = DeviceBuffer(n * 4, "dk");
    dv = DeviceBuffer(n * 4, "dv");
    fill(dout.data(), static_cast<int64_t>(n), a.dtype, 4);
    RINGATTN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  auto run_fwd = [&] {
    plan.forward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>());
  };
  auto run_bwd = [&] {
    plan.backward(q.data(), k.data(), v.data(), out.as<float>(), lse.as<float>(), dout.data(),
                  dq.as<float>(), dk.as<float>(), dv.as<float>());
  };
  // The first forward settles the automatic kernel choice (timed inside the plan).
  run_fwd();
  plan.synchronize();
  auto time = [&](auto&& f) { return time_ms(a, f); };
  const double flops = 4.0 * static_cast<double>(s.head_dim) * attended_pairs(a.cfg);
  auto emit = [&](const char* pass, double f, std::pair<double, std::vector<double>> t) {
    nlohmann::json j = row_base(a, std::string(pass) == "bwd" ? plan.backward_kernel_name()
                                                              : plan.kernel_name());
    j["pass"] = pass;
    j["ms"] = t.first;
    j["tflops"] = f / (t.first * 1e9);
    j["ms_all"] = t.second;
    j["device_peak_bytes"] = device_bytes_peak();
    j["notes"] = plan.notes();
    std::cout << j.dump() << std::endl;
  };
  if (a.fwd) emit("fwd", flops, time(run_fwd));
  if (a.bwd) {
    run_fwd();  // backward needs this forward's out and lse
    emit("bwd", 2.5 * flops, time(run_bwd));
  }
  return 0;
}

// Largest N (a multiple of the largest segment) whose dilated forward runs, against the
// bound of memory for q, k, v (dtype), out (fp32) and lse (fp32) alone.
int max_n(Args a) {
  const Shape4 s = a.cfg.shape;
  std::size_t free_b = 0, total_b = 0;
  RINGATTN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double per_token = static_cast<double>(s.batch) *
                           (static_cast<double>(s.heads * s.head_dim) *
                                (3.0 * static_cast<double>(bytes_per_element(a.dtype)) + 4.0) +
                            4.0 * static_cast<double>(s.heads));
  int64_t step = 1;
  for (int64_t w : a.cfg.segments) step = std::max(step, w);
  if (a.cfg.attention == AttentionKind::dense) step = 1024;
  const auto bound = static_cast<int64_t>(static_cast<double>(free_b) / per_token);
  int64_t n = bound / step * step;
  int64_t best = 0;
  std::string last_error;
  // Down from the bound in steps of 1% until a forward runs.
  const int64_t dec = std::max<int64_t>(step, (bound / 100) / step * step);
  while (n >= step) {
    a.cfg.shape.seq_len = n;
    try {
      Args b = a;
      b.bwd = false;
      b.iters = 1;
      b.warmup = 0;
      std::ostringstream sink;
      std::streambuf* old = std::cout.rdbuf(sink.rdbuf());
      try {
        bench(b);
      } catch (...) {
        std::cout.rdbuf(old);
        throw;
      }
      std::cout.rdbuf(old);
      best = n;
      break;
    } catch (const RuntimeFailure& e) {
      last_error = e.what();
      (void)cudaGetLastError();
      n -= dec;
    }
  }
  nlohmann::json j = row_base(a, "native");
  j["pass"] = "max_n";
  j["max_seq_len"] = best;
  j["memory_bound_seq_len"] = bound;
  j["fraction_of_bound"] = bound ? static_cast<double>(best) / static_cast<double>(bound) : 0.0;
  j["free_bytes_at_start"] = free_b;
  j["total_bytes"] = total_b;
  if (!best) j["last_error"] = last_error;
  std::cout << j.dump() << std::endl;
  return best ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const CudaDeviceStatus s = probe_cuda_device();
    if (!s.usable) {
      std::cerr << "gpu_bench: SKIPPED: " << s.reason << "\n";
      return 2;
    }
    return a.max_n ? max_n(a) : bench(a);
  } catch (const InputError& e) {
    std::cerr << "gpu_bench: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "gpu_bench: error: " << e.what() << "\n";
    return 3;
  }
}
