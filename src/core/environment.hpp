// The environment variables ringattn reads: one table (name, values, meaning), grouped as
// docs/ENVIRONMENT.md lists them (test_core checks that the two agree), and the one accessor
// every read goes through. A read names an `Env`, so a variable outside the table cannot be
// read; test_core also fails on any getenv elsewhere in src/ (the CLI, which reaches only
// <ringattn/...>, keeps its own two reads, and they must name variables of this table).
// Header-only, so that every target that reads one (the library, the CUDA kernels' target,
// the emulator) has it without linking another.
#pragma once

#include <cstddef>
#include <cstdlib>

namespace ringattn {

enum class Env {
  // CPU kernels
  cpu_kernels,
  small_gemm,
  blas_library,
  // GPU kernels
  device_memory_limit,
  hopper_fwd,
  hopper_bwd,
  hopper_bwd_schedule,
  hopper_overlap,
  hopper_qregs,
  hopper_pingpong,
  hopper_blocks_per_sm,
  // faults and tests
  fault_inject,
  test_plant_hang,
  test_ring_auto_ms,
  test_verified_forms,
  // the SIMT emulator
  emu_devices,
  emu_device_memory,
  emu_profile,
  emu_stream_delay,
  emu_order,
  emu_cp_async,
  emu_arrive,
  emu_cudnn_standin,
  emu_cudnn_refuse,
  emu_cudnn_empty_rows,
  // the command line
  progress_interval,
  slurm_ntasks,
  // other programs' variables
  openblas_coretype,
  openblas_thread_timeout,
  libxsmm_target,
  ompi_comm_world_size,
  pmi_size,
  pmix_rank,
  pmi_rank,
  mpi_localnranks,
  mv2_comm_world_size,
};

struct EnvironmentVariable {
  Env id;
  const char* group;  // the heading docs/ENVIRONMENT.md lists it under
  const char* name;
  const char* values;   // what it may be set to, and what unset means
  const char* meaning;  // what it does, and when it is read
};

namespace environment_detail {
inline constexpr const char* kStartedByMpi =
    "when set, `launched_by_mpi()` is true: the process was started by an MPI launcher, and the "
    "CLI runs on its ranks";
}  // namespace environment_detail

// In Env's order (checked below). Markdown: docs/ENVIRONMENT.md holds these cells verbatim.
inline constexpr EnvironmentVariable kEnvironment[] = {
    {Env::cpu_kernels, "CPU kernels", "RINGATTN_CPU_KERNELS",
     "`auto` (unset, empty: the best this CPU executes), `avx512`, `avx2`, `portable`",
     "the CPU kernels' vector variant; one this CPU cannot execute is refused (exit 2); "
     "OpenBLAS's kernels and libxsmm's target follow it; read once"},
    {Env::small_gemm, "CPU kernels", "RINGATTN_SMALL_GEMM",
     "`libxsmm`, `avx2`, `openblas` (unset, empty: libxsmm where built in, else avx2 where "
     "the CPU runs it, else openblas)",
     "the tile products' backend; one this build or CPU cannot run is refused (exit 2)"},
    {Env::blas_library, "CPU kernels", "RINGATTN_BLAS_LIBRARY",
     "a path or file name of an OpenBLAS `libopenblas.so.0` (unset, empty: the OpenMP build "
     "found at configure time, then `libopenblas.so.0`)",
     "the OpenBLAS opened with dlopen; one that cannot be opened, or is not OpenBLAS, is "
     "refused (exit 2)"},
    {Env::device_memory_limit, "GPU kernels", "RINGATTN_DEVICE_MEMORY_LIMIT",
     "a positive number of bytes (unset, empty: no limit)",
     "the most device memory ringattn holds on all devices, to leave the rest of a shared GPU "
     "to the framework beside it; read at every allocation"},
    {Env::hopper_fwd, "GPU kernels", "RINGATTN_HOPPER_FWD", "`auto`",
     "on the emulated GPU, lets `--kernel auto` time the sm_90a forward's forms (a GPU always "
     "times them); other values are refused (exit 2)"},
    {Env::hopper_bwd, "GPU kernels", "RINGATTN_HOPPER_BWD",
     "`two_pass`, `fused`, `fused_wide`, `auto` (unset: by rule)",
     "forces the sm_90a backward's form where it applies (D ≤ 128 and 192/128, `fused_wide` "
     "D = 64 or 128; not under `--deterministic`); `auto` lets `--kernel auto` time them on the emulated GPU; "
     "read once"},
    {Env::hopper_bwd_schedule, "GPU kernels", "RINGATTN_HOPPER_BWD_SCHEDULE",
     "`serial` (unset), `overlap`",
     "`overlap`: the sm_90a fused backwards issue Sᵀ and dPᵀ together, run the softmax under "
     "dPᵀ and dS under dV's product (FlashAttention-3's order); read once"},
    {Env::hopper_overlap, "GPU kernels", "RINGATTN_HOPPER_OVERLAP", "`0` (unset), `1`",
     "`1`: the sm_90a forward overlaps the next tile's S = Q·Kᵀ with this tile's softmax "
     "(D ≤ 128); read once"},
    {Env::hopper_qregs, "GPU kernels", "RINGATTN_HOPPER_QREGS", "`0` (unset), `1`",
     "`1`: the sm_90a kernels keep their resident tiles (Q; in the backward Q and dO, at D = 64 "
     "K and V) in registers as wgmma's A (D ≤ 128); read once"},
    {Env::hopper_pingpong, "GPU kernels", "RINGATTN_HOPPER_PINGPONG",
     "`0`, `1`, `2` (unset: `1` at D = 256, `0` below)",
     "the dense sm_90a forward's ping-pong form at every head dim: none, 64-key steps, 128-key "
     "steps (64-key at D = 256); read once"},
    {Env::hopper_blocks_per_sm, "GPU kernels", "RINGATTN_HOPPER_BLOCKS_PER_SM", "`1`, `2` (unset)",
     "`1` pads the sm_90a kernels' shared memory so that one block runs per SM (an A/B "
     "against the two they allow); read once"},
    {Env::fault_inject, "Faults and tests", "RINGATTN_FAULT_INJECT",
     "`rank=R,step=S`, then optionally `,mode=fail` (the default) or `,mode=stall` (R, S ≥ 0)",
     "rank R of the ring fails (exit 3), or stalls until aborted, at ring step S; anything else "
     "is refused (exit 2)"},
    {Env::test_plant_hang, "Faults and tests", "RINGATTN_TEST_PLANT_HANG", "`1`",
     "plants the watchdog's probe, a kernel that never finishes, on the stream of a one-GPU "
     "plan's first forward (tests of the watchdog)"},
    {Env::test_ring_auto_ms, "Faults and tests", "RINGATTN_TEST_RING_AUTO_MS",
     "2 or 4 comma-separated milliseconds: ours and cuDNN's for the forward, then for the "
     "backward (2: the forward's for both)",
     "stubs the GPU ring's `--kernel auto` timings of its steps against cuDNN's; anything else "
     "is refused (exit 2)"},
    {Env::test_verified_forms, "Faults and tests", "RINGATTN_TEST_VERIFIED_FORMS",
     "a comma-separated list of form names, or `all`",
     "emulated builds only: adds forms to the verified-forms table, so that tests reach "
     "`--kernel auto`'s timing of forms no GPU has passed yet; read at each use"},
    {Env::emu_devices, "The SIMT emulator", "RINGATTN_EMU_DEVICES", "1 to 64 (unset, empty: 4)",
     "the number of emulated devices"},
    {Env::emu_device_memory, "The SIMT emulator", "RINGATTN_EMU_DEVICE_MEMORY",
     "bytes, 2^20 to 2^44 (unset, empty: 16 GiB)", "each emulated device's memory"},
    {Env::emu_profile, "The SIMT emulator", "RINGATTN_EMU_PROFILE",
     "a comma-separated list of `sm_90`, `sm_86` (unset, empty: `sm_90`)",
     "device d's profile is the list's d-th, the last one repeating"},
    {Env::emu_stream_delay, "The SIMT emulator", "RINGATTN_EMU_STREAM_DELAY",
     "a seed, 0 to 2^64 - 1 (unset, empty: no delays)",
     "a random 0-200 µs before each task a stream runs, drawn from the seed"},
    {Env::emu_order, "The SIMT emulator", "RINGATTN_EMU_ORDER",
     "`forward` (unset, empty), `reverse`, `shuffled`, `shuffled:SEED`",
     "the order in which the emulator runs blocks, the warps of each barrier interval and the "
     "lanes between collectives"},
    {Env::emu_cp_async, "The SIMT emulator", "RINGATTN_EMU_CP_ASYNC",
     "`at-copy` (unset, empty), `at-wait`", "when a `cp.async` lands: at the copy or at its wait"},
    {Env::emu_arrive, "The SIMT emulator", "RINGATTN_EMU_ARRIVE",
     "`continue` (unset, empty), `yield`",
     "whether a thread whose `mbarrier.arrive` completes a phase that others wait on runs on "
     "or steps aside until they have run"},
    {Env::emu_cudnn_standin, "The SIMT emulator", "RINGATTN_EMU_CUDNN_STANDIN", "`1`",
     "a float64 reference stands in for cuDNN's graphs (tests of the code around them); "
     "otherwise cuDNN is refused on the emulated GPU"},
    {Env::emu_cudnn_refuse, "The SIMT emulator", "RINGATTN_EMU_CUDNN_REFUSE",
     "`band`, `one_token_backward`",
     "the stand-in refuses every view with a diagonal band, or the backward of a 1 x 1 view, "
     "as a cuDNN that cannot build those graphs does"},
    {Env::emu_cudnn_empty_rows, "The SIMT emulator", "RINGATTN_EMU_CUDNN_EMPTY_ROWS",
     "`zero` (unset, anything else), `nan`, `garbage`",
     "what the stand-in returns for a view row that sees no key"},
    {Env::progress_interval, "The command line", "RINGATTN_PROGRESS_INTERVAL",
     "seconds ≥ 0 (unset, not a number: 1)",
     "the least time between two progress lines (`--progress` where stderr is not a "
     "terminal); `0`: a line at every change"},
    {Env::slurm_ntasks, "The command line", "SLURM_NTASKS", "set by Slurm",
     "more than 1 while MPI reports one rank is refused as a launch mistake (exit 2)"},
    {Env::openblas_coretype, "Other programs' variables", "OPENBLAS_CORETYPE", "OpenBLAS's",
     "when set, OpenBLAS chooses its kernels by it; else ringattn sets it, for the open only, "
     "from the CPU kernels' variant"},
    {Env::openblas_thread_timeout, "Other programs' variables", "OPENBLAS_THREAD_TIMEOUT",
     "OpenBLAS's",
     "unless set, ringattn sets `4` for the open only, so that OpenBLAS's idle pool threads "
     "sleep at once"},
    {Env::libxsmm_target, "Other programs' variables", "LIBXSMM_TARGET", "libxsmm's",
     "unless set, a forced `RINGATTN_CPU_KERNELS=avx2` sets libxsmm's target to `hsw`"},
    {Env::ompi_comm_world_size, "Other programs' variables", "OMPI_COMM_WORLD_SIZE",
     "set by Open MPI's launcher", environment_detail::kStartedByMpi},
    {Env::pmi_size, "Other programs' variables", "PMI_SIZE",
     "set by PMI launchers (MPICH's, Intel MPI's, srun's)", environment_detail::kStartedByMpi},
    {Env::pmix_rank, "Other programs' variables", "PMIX_RANK", "set by PMIx launchers",
     environment_detail::kStartedByMpi},
    {Env::pmi_rank, "Other programs' variables", "PMI_RANK",
     "set by PMI launchers (MPICH's, Intel MPI's, srun's)", environment_detail::kStartedByMpi},
    {Env::mpi_localnranks, "Other programs' variables", "MPI_LOCALNRANKS",
     "set by MPICH's launcher", environment_detail::kStartedByMpi},
    {Env::mv2_comm_world_size, "Other programs' variables", "MV2_COMM_WORLD_SIZE",
     "set by MVAPICH's launcher", environment_detail::kStartedByMpi},
};

namespace environment_detail {
constexpr bool in_env_order() {
  std::size_t i = 0;
  for (const EnvironmentVariable& v : kEnvironment)
    if (static_cast<std::size_t>(v.id) != i++) return false;
  return i == static_cast<std::size_t>(Env::mv2_comm_world_size) + 1;
}
static_assert(in_env_order(), "kEnvironment lists every Env once, in Env's order");
}  // namespace environment_detail

constexpr const EnvironmentVariable& environment_entry(Env v) {
  return kEnvironment[static_cast<std::size_t>(v)];
}

// "RINGATTN_CPU_KERNELS": the variable's name, for messages and setenv.
constexpr const char* environment_name(Env v) { return environment_entry(v).name; }

// The variable's value, or nullptr when it is unset (getenv's answer: each reader keeps its
// own rule for an empty value).
inline const char* environment_value(Env v) { return std::getenv(environment_name(v)); }

}  // namespace ringattn
