// The GPU tests' skip: without a usable device (no GPU, no driver, a CPU-only build) a test
// is skipped with the reason printed, never silently.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/choice/verified_forms.hpp"
#include "single/cuda_plan.hpp"

#define REQUIRE_GPU()                                                          \
  do {                                                                         \
    const ::ringattn::CudaDeviceStatus gpu_ = ::ringattn::probe_cuda_device(); \
    if (!gpu_.usable) GTEST_SKIP() << "SKIPPED: " << gpu_.reason;              \
  } while (0)

namespace ringattn::testing {

// An environment variable set (or with a null value, unset) for one scope; the previous
// value comes back after it.
struct EnvScope {
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~EnvScope() { had_ ? setenv(name_.c_str(), old_.c_str(), 1) : unsetenv(name_.c_str()); }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// On the emulated GPU, cuDNN's stand-in (cudnn/graphs_emulated.cpp) for as long as it lives:
// RINGATTN_EMU_CUDNN_STANDIN=1 in this process and the CLI processes it starts.
struct CudnnStandinScope {
  CudnnStandinScope() { setenv("RINGATTN_EMU_CUDNN_STANDIN", "1", 1); }
  ~CudnnStandinScope() { unsetenv("RINGATTN_EMU_CUDNN_STANDIN"); }
  CudnnStandinScope(const CudnnStandinScope&) = delete;
  CudnnStandinScope& operator=(const CudnnStandinScope&) = delete;
};

// The kernel family a plan's backward_kernel_name() names: "hopper-fused" and
// "hopper-fused-wide" (the sm_90a backward as a fused kernel: RINGATTN_HOPPER_BWD=fused or
// fused_wide, or --kernel auto timing it faster) are sm_90a kernels, "hopper".
inline std::string kernel_family(const std::string& name) {
  return name.starts_with("hopper-fused") ? "hopper" : name;
}

// Whether --kernel auto times the sm_90a backward's fused kernel against its two passes on
// `path` under RINGATTN_HOPPER_BWD's value `env` ("" unset): on a GPU unless the variable
// forces a form, on the emulated GPU only with "auto" (hopper_fused_backward_rule); and only
// where a fused form has passed on a GPU there (verified_forms.hpp; on the emulated GPU,
// RINGATTN_TEST_VERIFIED_FORMS).
inline bool auto_times_fused_backward(const std::string& env, kernels::cuda::GpuPath path) {
  using kernels::cuda::GpuForm;
  const bool verified = kernels::cuda::verified_on_gpu(GpuForm::hopper_backward_fused, path) ||
                        kernels::cuda::verified_on_gpu(GpuForm::hopper_backward_fused_wide, path);
#if RINGATTN_CUDA_EMULATION
  return env == "auto" && verified;
#else
  return (env.empty() || env == "auto") && verified;
#endif
}

// Whether --kernel auto would time the sm_90a backward's forms under `env` were they all
// verified: the forms it left out then each have a note (kernels::cuda::unverified_by_auto_note).
inline bool auto_would_time_backward(const std::string& env) {
#if RINGATTN_CUDA_EMULATION
  return env == "auto";
#else
  return env.empty() || env == "auto";
#endif
}

// Whether --kernel auto times the sm_90a forward's forms on a non-deterministic first forward
// (hopper_forward_forms_timed): not where RINGATTN_HOPPER_OVERLAP, _QREGS or _PINGPONG chose
// a form; on the emulated GPU only with RINGATTN_HOPPER_FWD=auto.
inline bool auto_times_forward_forms() {
  for (const char* name :
       {"RINGATTN_HOPPER_OVERLAP", "RINGATTN_HOPPER_QREGS", "RINGATTN_HOPPER_PINGPONG"})
    if (const char* v = std::getenv(name); v && *v) return false;
#if RINGATTN_CUDA_EMULATION
  const char* v = std::getenv("RINGATTN_HOPPER_FWD");
  return v && std::string(v) == "auto";
#else
  return true;
#endif
}

// RINGATTN_HOPPER_BWD's value, "" when unset.
inline std::string hopper_bwd_env() {
  const char* v = std::getenv("RINGATTN_HOPPER_BWD");
  return v ? v : "";
}

}  // namespace ringattn::testing
