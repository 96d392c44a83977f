// Which GPU kernel forms `--kernel auto` may time or run: only those a committed GPU log shows
// passing, on the path they passed on. The emulator checks a form's arithmetic, but not a
// deadlock that needs real concurrency, a sticky device fault, or its speed; until a GPU has
// run a form, auto leaves it out (the explicit switches still run it, with a note saying it
// is unverified on hardware). The table (kVerified) is here, each entry beside the log that
// admits it; the commit that adds an entry is the one that commits that log.
#pragma once

#include <algorithm>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>

#include "core/environment.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::kernels::cuda {

// Where a form runs: one GPU's dense kernels, one GPU's task kernels (dilated patterns),
// block-sparse (one GPU or distributed), the GPU ring's steps.
enum class GpuPath { dense, tasks, sparse, ring };

// The forms beside the baseline (the native kernels, which every GPU log since the first
// shows passing). Each sm_90a form is a variant of one kernel family; each cuDNN one a use of
// cuDNN's graphs that runs code of ours around them (views, epilogues, gradients' adds).
enum class GpuForm {
  hopper_forward_plain,        // the sm_90a forward's loop
  hopper_forward_overlap,      // RINGATTN_HOPPER_OVERLAP=1
  hopper_forward_qregs,        // RINGATTN_HOPPER_QREGS=1: Q (and dO) in registers
  hopper_forward_pingpong64,   // RINGATTN_HOPPER_PINGPONG=1 (dense)
  hopper_forward_pingpong128,  // RINGATTN_HOPPER_PINGPONG=2 (dense)
  hopper_backward_two_pass,    // the sm_90a backward's two passes (deterministic)
  hopper_backward_fused,       // RINGATTN_HOPPER_BWD=fused: one launch, dQ by bulk adds
  hopper_backward_fused_wide,  // RINGATTN_HOPPER_BWD=fused_wide: 128-key blocks, D = 64, 128
  hopper_softcap,              // the sm_90a kernels on a soft-capped job (every form)
  hopper_value_dim,            // the sm_90a kernels at D = 192, Dv = 128 (plain, both backwards)
  cudnn_forward,               // one GPU: cuDNN's SDPA forward over the plan's views
  cudnn_backward,              // one GPU: its backward where one view writes each row
  cudnn_dilated_backward,      // one GPU: a dilated mixture's or grouped heads' backward
  cudnn_ring_steps,            // the GPU ring: each step's tasks as cuDNN views
  cudnn_value_dim_softcap,     // cuDNN's graphs with Dv != D or a soft-cap modifier (also ring)
};

namespace verified_detail {

struct Verified {
  GpuForm form;
  GpuPath path;
};

using F = GpuForm;
using P = GpuPath;

constexpr Verified kVerified[] = {
    // gpu-h200-20261126-a9aff03/call3-hopper_tests.log (0eb3d8a): CudaHopper.Forward*,
    // CudaHopper.Backward*, CudaHopper.PlanRunsDilated*, CudaHopper.Sparse*,
    // CudaSparseKernels.KernelHopper*, Hopper/CudaRingHopper.* (P = 1..4, six cases),
    // CudaSparseRingFeatures.KernelHopper*; and call3-tests.log, the whole gpu suite.
    {F::hopper_forward_plain, P::dense},
    {F::hopper_forward_plain, P::tasks},
    {F::hopper_forward_plain, P::sparse},
    {F::hopper_forward_plain, P::ring},
    {F::hopper_backward_two_pass, P::dense},
    {F::hopper_backward_two_pass, P::tasks},
    {F::hopper_backward_two_pass, P::sparse},
    {F::hopper_backward_two_pass, P::ring},
    // gpu-h100-20261126-353d64e/call2-hopper_tests.log (353d64e, the overlap then the
    // default on every Work): the same tests as above.
    {F::hopper_forward_overlap, P::dense},
    {F::hopper_forward_overlap, P::tasks},
    {F::hopper_forward_overlap, P::sparse},
    {F::hopper_forward_overlap, P::ring},
    // gpu-h200-20261126-a9aff03/call3-hopper_tests.log: CudaHopper.Forward* and
    // CudaHopper.PlanWithKernelHopper* under RINGATTN_HOPPER_PINGPONG=1 and =2 (dense only).
    {F::hopper_forward_pingpong64, P::dense},
    {F::hopper_forward_pingpong128, P::dense},
    // gpu-h200-20261126-952e766/tests.log and gpu-h200-20261126-a9aff03/call3-tests.log:
    // test_cudnn_graphs, Golden/CudaGolden.CudnnKernel* (dense and dilated views, forward),
    // CudaKernels.CudnnRunsGqaWindows* (dense, causal, windows, GQA, packed; forward and
    // backward); gpu_bench's cudnn rows in gpu-h200-20261126-952e766/gpu_bench_table.txt.
    {F::cudnn_forward, P::dense},
    {F::cudnn_forward, P::tasks},
    {F::cudnn_backward, P::dense},
    // Not yet on any GPU (no entry): hopper_forward_qregs; hopper_backward_fused and
    // hopper_backward_fused_wide; hopper_softcap; hopper_value_dim; cudnn_dilated_backward;
    // cudnn_ring_steps; cudnn_value_dim_softcap.
};

}  // namespace verified_detail

// "fused", "cudnn_ring_steps": the form's name in RINGATTN_TEST_VERIFIED_FORMS.
inline std::string_view form_name(GpuForm form) {
  switch (form) {
    case GpuForm::hopper_forward_plain: return "plain";
    case GpuForm::hopper_forward_overlap: return "overlap";
    case GpuForm::hopper_forward_qregs: return "qregs";
    case GpuForm::hopper_forward_pingpong64: return "pingpong64";
    case GpuForm::hopper_forward_pingpong128: return "pingpong128";
    case GpuForm::hopper_backward_two_pass: return "two_pass";
    case GpuForm::hopper_backward_fused: return "fused";
    case GpuForm::hopper_backward_fused_wide: return "fused_wide";
    case GpuForm::hopper_softcap: return "hopper_softcap";
    case GpuForm::hopper_value_dim: return "hopper_value_dim";
    case GpuForm::cudnn_forward: return "cudnn_forward";
    case GpuForm::cudnn_backward: return "cudnn_backward";
    case GpuForm::cudnn_dilated_backward: return "cudnn_dilated_backward";
    case GpuForm::cudnn_ring_steps: return "cudnn_ring_steps";
    case GpuForm::cudnn_value_dim_softcap: return "cudnn_value_dim_softcap";
  }
  return "?";
}

// Whether a committed GPU log shows `form` passing on `path`. In emulated builds,
// RINGATTN_TEST_VERIFIED_FORMS (a comma list of form_name()s, or "all"; read at each call)
// adds forms, so that tests reach auto's timing of forms no GPU has passed yet; real builds
// have no such switch.
inline bool verified_on_gpu(GpuForm form, GpuPath path) {
#if RINGATTN_CUDA_EMULATION
  if (const char* env = environment_value(Env::test_verified_forms)) {
    std::istringstream in(env);
    for (std::string part; std::getline(in, part, ',');)
      if (part == "all" || part == form_name(form)) return true;
  }
#endif
  const auto& table = verified_detail::kVerified;
  return std::any_of(std::begin(table), std::end(table), [&](const verified_detail::Verified& v) {
    return v.form == form && v.path == path;
  });
}

// "the sm_90a backward's fused kernel": the form in a sentence.
inline std::string form_description(GpuForm form) {
  switch (form) {
    case GpuForm::hopper_forward_plain: return "the sm_90a forward's plain loop";
    case GpuForm::hopper_forward_overlap: return "the sm_90a forward's overlapped loop";
    case GpuForm::hopper_forward_qregs: return "the sm_90a forward with Q in registers";
    case GpuForm::hopper_forward_pingpong64: return "the sm_90a ping-pong forward (64-key steps)";
    case GpuForm::hopper_forward_pingpong128: return "the sm_90a ping-pong forward (128-key steps)";
    case GpuForm::hopper_backward_two_pass: return "the sm_90a backward's two passes";
    case GpuForm::hopper_backward_fused: return "the sm_90a backward's fused kernel";
    case GpuForm::hopper_backward_fused_wide: return "the sm_90a backward's wide fused kernel";
    case GpuForm::hopper_softcap: return "the sm_90a kernels' soft-cap";
    case GpuForm::hopper_value_dim:
      return "the sm_90a kernels with values of their own head dim (192/128)";
    case GpuForm::cudnn_forward: return "cuDNN's forward";
    case GpuForm::cudnn_backward: return "cuDNN's backward";
    case GpuForm::cudnn_dilated_backward: return "cuDNN's dilated backward";
    case GpuForm::cudnn_ring_steps: return "cuDNN on the ring's steps";
    case GpuForm::cudnn_value_dim_softcap:
      return "cuDNN's graphs with values of their own head dim or a soft-cap score modifier";
  }
  return "?";
}

// The note for a form auto left out: "kernel=auto leaves out <description>: no committed
// GPU log shows it passing yet (<how_to_run> runs it anyway; docs/GPU_PERFORMANCE.md)".
inline std::string unverified_by_auto_note(GpuForm form, std::string_view how_to_run) {
  std::string s = field_is("kernel", "auto") + " leaves out " + form_description(form) +
                  ": no committed GPU log shows it passing yet (";
  s += how_to_run;
  s += " runs it anyway; docs/GPU_PERFORMANCE.md)";
  return s;
}

// The note where an explicit switch runs a form no GPU has passed: "<how> runs
// <description>, unverified on hardware: no committed GPU log shows it passing yet".
inline std::string forced_unverified_note(GpuForm form, std::string_view how) {
  std::string s(how);
  s += " runs " + form_description(form) +
       ", unverified on hardware: no committed GPU log shows it passing yet";
  return s;
}

}  // namespace ringattn::kernels::cuda
