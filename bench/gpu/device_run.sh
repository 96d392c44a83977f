#!/usr/bin/env bash
# Runs ON the lent GPU machine, from a copy of the repository, with the build that
# scripts/gpu_build_for_device.sh packed into .gpu-carry/ringattn-gpu.tar.xz (name
# `.gpu-carry` in the device tool's `carry`); it is unpacked to /tmp. Nothing is compiled.
#
# The next lent GPU: one command (first build the carry here, no GPU needed:
# `ARCHS=90 PY_KIT=0 scripts/gpu_build_for_device.sh`), then the device tool's run with
# carry [".gpu-carry"] and timeout_s 560:
#
#   bash bench/gpu/device_run.sh verify tests sanitize ab flex ring dilated sinks mla
#
# It ends by DEADLINE_S (480 s from its start) whatever happens, which leaves a 560 s call
# time to hand its files back and the lease time to rerun; $OUT/summary.txt then says what
# passed, failed, hung or timed out, and what did not run. With device time left, run the
# command its "to run what the deadline left out" line gives, with a DEADLINE_S that fits
# (the device tool's budget_left_s less the machine's start and 80 s).
#
# Stages, run in the order given (each item of each stage bounded; see "Time" below):
#   verify    the kernel forms that have never run on a GPU, each under the hang guard: the
#             fused and wide fused sm_90a backward, the forward's Q in registers, cuDNN's
#             steps on the GPU ring, cuDNN's dilated backward, sinks on every GPU path,
#             one GPU's --kernel auto beside the sm_90a kernels, MLA head dims and
#             soft-capping on every GPU path (native, cuDNN's graphs, the sm_90a soft-cap),
#             the parallel sinks' gradient, and the newest tests
#   tests     the gpu-labelled tests, each binary in filter groups of at most TEST_TIMEOUT_S,
#             then the ring and distributed block-sparse tests again (REPEAT times, default 1)
#   sanitize  compute-sanitizer memcheck and racecheck: the new forms first (the fused and
#             wide backward, the ring's cuDNN steps, the sinks kernels), then the kernel,
#             block-sparse and ring tests as before
#   check     tests, then sanitize
#   ab        hopper_ab.py: the backward's forms (two-pass, fused, fused_wide) beside cuDNN
#             at D = 128 (AB_VARIANTS, AB_HEAD_DIMS narrow or widen it)
#   flex      block-sparse against FlexAttention (flex_sparse.py)
#   ring      the ring and block-sparse rows (ring_bench.py; RING_KERNELS, default
#             hopper,cudnn,auto: our steps and cuDNN's at P = 1, 2, 4)
#   dilated   the dilated rows against the replaced project's gather/SDPA/scatter
#             (run_bench.py --attention dilated --quick)
#   sinks     what attention sinks cost, forward and backward, on each GPU path (sinks_cost.py)
#   mla       MLA head dims (192/128) and soft-capping on the native, sm_90a and cuDNN
#             kernels, beside the plain problem and torch's SDPA (mla_cost.py)
#   python    the Python package on CUDA tensors (a carried wheel for the image's Python, or
#             the carried kit linked here), or what it lacks
#   bench     the card's ceilings, then the benchmark sweep (run_bench.py) and max N
#   hopper    the sm_90a kernels' tests under every switch, then hopper_ab.py's whole table
#   builds    gpu_bench builds against each other (builds_ab.py): the carried gpu_bench
#             first, then every variants/gpu_bench_* in .gpu-carry/variants.tar.xz
#             (BUILDS_ARGS adds builds_ab.py options, e.g. "--pass fwd --rows d128")
#   profile   Nsight Compute (ncu, in the image) over the Hopper dense forward and backward
#             kernels at D = 128: speed of light, warp stalls, the tensor pipe
#   ring+bench, all (verify tests sanitize ring bench)
#
# Time: DEADLINE_S (default 480) counts from the script's start, unpacking included. Every
# command runs under `timeout` with the smaller of its own limit and what is left; an item
# is not started with less than MIN_START_S (10) left, a benchmark with less than 60 s. At
# the deadline the item under way is stopped, and every item of every stage not yet run is
# listed by name. Own limits: TEST_TIMEOUT_S (60) per test filter group, SANITIZE_TIMEOUT_S
# (120) per sanitizer run, MEMCHECK_RERUN_S (45) for the memcheck rerun of a failing case in
# verify and hopper (HOPPER_MEMCHECK=0 skips it; it is skipped too when less than twice that
# is left), each benchmark its budget (HOPPER_BUDGET_S 240 for hopper's A/B, AB_BUDGET_S 120,
# FLEX_BUDGET_S 120, RING_BUDGET_S 150, DILATED_BUDGET_S 120, SINKS_BUDGET_S 90, BUDGET_S
# 420 for bench; each further cut to what is left), PY_TIMEOUT_S (300), PROFILE_TIMEOUT_S
# (90 per kernel).
#
# The hang guard: a test group that outlives its own limit is a HANG, recorded with its
# binary, filter, environment and (where gtest had started it) the test; every later item of
# the same kernel form (its other tests, its sanitizer runs, its benchmark columns) is then
# not run, saying why, and the call carries on with the other forms. Tests that ran without
# a switch are not run twice: what verify ran is left out of the tests stage's groups, and
# a test that hung (or whose form did) out of every later item's filter.
#
# Narrowing: TESTS (the tests stage's binaries), FILTER_<binary> (one filter for that binary
# instead of its groups), QUICK, SKIP_MAX_N, BUILDS_ARGS, FLEX_SEQ_LEN, PY_TESTS as before.
# Testing without a GPU: CARRY_DIR=<an unpacked carry> takes it as is (no archive needed);
# CARRY_ARCHIVE=<path> names another archive.
#
# Output under $OUT (the device tool's folder; /tmp/ringattn-gpu when unset): summary.txt
# (rewritten after every item, so a killed call still leaves it), device.txt, verify.log,
# tests.log, sanitizer.log, hopper_tests.log, <stage>.log for the others, and each
# benchmark's rows and table (hopper_ab_*, flex_sparse_*, ring_bench_*, gpu_bench_*,
# sinks_cost_*, mla_cost_*, builds_ab_*, ceilings.json, profile.txt, python.log).
# Exit status: 0 when every item of every stage asked for ran and passed; 1 when any
# failed, hung, timed out or did not run; 2 for a usage error or a missing carry.
# shellcheck disable=SC2317  # the plan_* and run_* functions are called by name, from the plan
set -uo pipefail
T0=$(date +%s)
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-/tmp/ringattn-gpu}
DEADLINE_S=${DEADLINE_S:-480}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-60}
SANITIZE_TIMEOUT_S=${SANITIZE_TIMEOUT_S:-120}
MEMCHECK_RERUN_S=${MEMCHECK_RERUN_S:-45}
MIN_START_S=${MIN_START_S:-10}
REPEAT=${REPEAT:-1}
STAGES=("$@")
[ $# -gt 0 ] || STAGES=(all)

# Stage names are checked before anything runs: a typo must not cost a lease's first minutes.
for stage in "${STAGES[@]}"; do
  case "$stage" in
    verify | tests | sanitize | check | ab | flex | ring | dilated | sinks | mla | python | \
      bench | hopper | builds | profile | ring+bench | all) ;;
    *)
      echo "device_run: unknown stage '$stage' (verify | tests | sanitize | check | ab | flex |" \
        "ring | dilated | sinks | mla | python | bench | hopper | builds | profile | ring+bench |" \
        "all)"
      exit 2 ;;
  esac
done

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/device_run.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/gpu_skips"
left() { echo $((T0 + DEADLINE_S - $(date +%s))); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

if [ -n "${CARRY_DIR:-}" ]; then
  CARRY=$CARRY_DIR
  [ -x "$CARRY/bin/test_cuda_kernels" ] ||
    { echo "device_run: CARRY_DIR=$CARRY has no bin/test_cuda_kernels"; exit 2; }
else
  ARCHIVE=${CARRY_ARCHIVE:-$ROOT/.gpu-carry/ringattn-gpu.tar.xz}
  if [ ! -f "$ARCHIVE" ]; then
    echo "device_run: no carried build at $ARCHIVE (run scripts/gpu_build_for_device.sh here and carry .gpu-carry)"
    exit 2
  fi
  CARRY=/tmp/ringattn-carry
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  timeout -k 5 "$(min 120 "$(left)")" python3 -c \
    "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$ARCHIVE" "$CARRY" ||
    { echo "device_run: cannot unpack $ARCHIVE"; exit 2; }
fi
# NCCL and cuDNN come from the image's PyTorch wheels (nvidia-nccl-cu13, nvidia-cudnn-cu13).
WHEEL_LIBS=$(timeout 30 python3 - <<'PY' 2>/dev/null
import glob, site
dirs = []
for sp in site.getsitepackages():
    dirs += sorted(glob.glob(sp + "/nvidia/*/lib")) + sorted(glob.glob(sp + "/nvidia/cu13/lib"))
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="$CARRY/lib${WHEEL_LIBS:+:$WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The tests' compiled-in paths point at the build machine; these override them.
export RINGATTN_TEST_DATA_DIR="$ROOT/tests/data"
export RINGATTN_CLI_PATH="$CARRY/bin/ringattn"
export PYTHONUNBUFFERED=1
export PATH="$PATH:/usr/local/cuda/bin"  # compute-sanitizer, ncu
{
  echo "== date"; date -u
  echo "== carried build"; cat "$CARRY/build_info.txt"
  echo "== nvidia-smi"; timeout 20 nvidia-smi
  echo "== compute-sanitizer"; timeout 20 compute-sanitizer --version 2>&1 | head -2
  echo "== profilers"; command -v nsys ncu 2>&1
  for f in /usr/local/cuda/bin/*; do printf '%s ' "${f##*/}"; done; echo
  echo "== LD_LIBRARY_PATH"; echo "$LD_LIBRARY_PATH" | tr ':' '\n'
  echo "== libraries the binaries resolve"
  timeout 20 ldd "$CARRY"/bin/* | grep -E "nccl|cudnn|openblas|cudart" | sort -u
  echo "== cudnn / nccl found"
  for d in ${WHEEL_LIBS//:/ }; do
    for f in "$d"/libcudnn.so* "$d"/libnccl.so*; do [ -e "$f" ] && echo "$f"; done
  done
} >"$OUT/device.txt" 2>&1

# ---- the items ----------------------------------------------------------------------------
# Every stage is planned as a list of items before anything runs, so that whatever the
# deadline cuts can be named. An item is one bounded command: a gtest binary with a filter
# (kind gtest), the same under compute-sanitizer (sanitize), or a function (fn: benchmarks,
# the Python package, profiles). Its form is the kernel form it exercises: a hang in one
# form stops that form's later items only (the tests stage's groups have none: each stands
# alone).
I_STAGE=() I_FORM=() I_KIND=() I_BIN=() I_FILTER=() I_ENV=() I_LIMIT=() I_ARG=() I_NEEDS=()
I_MINSTART=() I_RESULT=() I_SECS=() I_NOTE=() I_DESC=()
declare -A HUNG=()      # form -> the item that hung
declare -A EXCL_RAN=()  # binary -> filters verify ran in the default environment
declare -A EXCL_HUNG=() # binary -> filters that hung in the default environment

# add KIND STAGE FORM BIN FILTER ENV LIMIT ARG NEEDS MINSTART
add() {
  I_KIND+=("$1") I_STAGE+=("$2") I_FORM+=("$3") I_BIN+=("$4") I_FILTER+=("$5") I_ENV+=("$6")
  I_LIMIT+=("$7") I_ARG+=("$8") I_NEEDS+=("$9") I_MINSTART+=("${10}")
  I_RESULT+=("") I_SECS+=("") I_NOTE+=("")
  # How the summary names it (made once: the summary is rewritten after every item).
  local d
  case "$1" in
    gtest) d="$4 --gtest_filter='$5'${8:+ $8}" ;;
    sanitize) d="compute-sanitizer ${8% } $4 --gtest_filter='$5'" ;;
    fn) d=$4 ;;
  esac
  I_DESC+=("$d${6:+ with $6}")
}
# gtest STAGE FORM BINARY FILTER [ENV]: ENV is VAR=value words (values without spaces).
gtest() { add gtest "$1" "$2" "$3" "$4" "${5:-}" "$TEST_TIMEOUT_S" "" "" "$MIN_START_S"; }
# sanitize STAGE FORM TOOL BINARY FILTER ENV [SANITIZER OPTIONS]
sanitize() {
  add sanitize "$1" "$2" "$4" "$5" "$6" "$SANITIZE_TIMEOUT_S" "--tool $3 ${7:-}" "" "$MIN_START_S"
}
# fn STAGE FORM DESCRIPTION LIMIT "FUNCTION ARGS" [NEEDS (forms, space-separated)] [MINSTART]
fn() { add fn "$1" "$2" "$3" "" "" "$4" "$5" "${6:-}" "${7:-$MIN_START_S}"; }

# The never-verified forms, each item binary + filter + switch. Filters that match nothing in
# this build (tests written after the carry was built) pass with "no test matched".
plan_fused() {  # RINGATTN_HOPPER_BWD=fused: dense, dilated, block-sparse and the ring's steps
  local s=$1 e=RINGATTN_HOPPER_BWD=fused
  gtest "$s" fused test_cuda_kernels 'CudaHopper.Backward*:CudaHopper.PlanRunsDilated*' $e
  gtest "$s" fused test_cuda_sparse '*Hopper*' $e
  gtest "$s" fused test_cuda_ring 'Hopper/CudaRingHopper.*' $e
  gtest "$s" fused test_cuda_ring 'CudaSparseRingFeatures.KernelHopper*' $e
  # (CudaHopper.Backward* above includes BackwardIntoAnOffsetDqRunsTheTwoPasses: a dq view at
  # a 4-byte offset, which the fused kernels' bulk reduce-adds cannot take, runs the two
  # passes with a note.)
}
plan_fused_wide() {  # =fused_wide: 128-key blocks of two consumer warpgroups, D = 64, 128
  local s=$1 e=RINGATTN_HOPPER_BWD=fused_wide
  gtest "$s" fused_wide test_cuda_kernels 'CudaHopper.Backward*:CudaHopper.PlanRunsDilated*' $e
  gtest "$s" fused_wide test_cuda_sparse '*KernelHopper*' $e
  gtest "$s" fused_wide test_cuda_ring 'Hopper/CudaRingHopper.*' $e
  gtest "$s" fused_wide test_cuda_ring 'CudaSparseRingFeatures.KernelHopper*' $e
}
plan_fused_overlap() {  # both fused kernels in FlashAttention-3's order within a tile
  local s=$1 o=RINGATTN_HOPPER_BWD_SCHEDULE=overlap
  gtest "$s" fused test_cuda_kernels 'CudaHopper.Backward*:CudaHopper.SoftcapOnThe*' \
    "RINGATTN_HOPPER_BWD=fused $o"
  gtest "$s" fused_wide test_cuda_kernels 'CudaHopper.Backward*:CudaHopper.SoftcapOnThe*' \
    "RINGATTN_HOPPER_BWD=fused_wide $o"
  gtest "$s" fused_wide test_cuda_sparse '*KernelHopper*' "RINGATTN_HOPPER_BWD=fused_wide $o"
}
plan_qregs() {  # RINGATTN_HOPPER_QREGS=1: the resident tiles as wgmma's register operand
  local s=$1 e=RINGATTN_HOPPER_QREGS=1
  gtest "$s" qregs test_cuda_kernels 'CudaHopper.*' $e
  gtest "$s" qregs test_cuda_sparse '*Hopper*' $e
}

plan_verify() {
  plan_fused verify
  plan_fused_wide verify
  plan_fused_overlap verify
  plan_qregs verify
  # cuDNN's steps on the GPU ring (--kernel cudnn and auto's choice, set inside the tests).
  gtest verify cudnn_ring test_cuda_ring 'CudaRing.Cudnn*'
  gtest verify cudnn_ring test_cuda_ring 'CudaRing.AutoTakesCudnn*'
  gtest verify cudnn_dilated_bwd test_cuda_kernels 'CudaKernels.CudnnDilatedBackward*'
  gtest verify sinks test_job_cuda 'EngineCuda.Sinks*'
  # The native kernels with values of their own head dim (MLA's 192/128) and soft-capped
  # logits on one GPU, the ring, Ulysses and block-sparse, and cuDNN's graphs with both (V/O of
  # their own width, the soft-cap score modifier): checked on the emulated GPU only
  # (verified_forms.hpp lists none of them).
  gtest verify mla_softcap test_job_cuda 'EngineCuda.ValueHeadDimAndSoftcap*:EngineCuda.Ulysses*'
  gtest verify mla_softcap test_cuda_ring 'MlaSoftcap/CudaRingMlaSoftcap.*'
  gtest verify mla_softcap test_cuda_ring 'CudaSparseRingFeatures.ValueHeadDimAndSoftcap*'
  gtest verify cudnn_mla_softcap test_cuda_kernels 'CudaKernels.CudnnValueHeadDimAndSoftcap*'
  # The sm_90a kernels' soft-cap: the forward and every backward form, and the plans' runs.
  gtest verify hopper_softcap test_cuda_kernels 'CudaHopper.SoftcapOnThe*'
  # The sm_90a kernels at D = 192, Dv = 128 (plain forward, two passes, and the fused form:
  # dV's launch, then dK's with dQ's part; dense, dilated tasks, capped; the ring's and
  # block-sparse's --kernel hopper cases are in the mla_softcap items, and under =fused here).
  gtest verify hopper_value_dim test_cuda_kernels 'CudaHopper.ValueHeadDim*'
  gtest verify hopper_value_dim test_cuda_kernels 'CudaHopper.ValueHeadDim*' \
    RINGATTN_HOPPER_BWD=fused
  gtest verify hopper_value_dim test_cuda_ring \
    'MlaSoftcap/CudaRingMlaSoftcap.*192_128*:CudaSparseRingFeatures.ValueHeadDimAndSoftcap*' \
    RINGATTN_HOPPER_BWD=fused
  # The sinks' gradient in parallel (one warp per 32 rows, a fixed order).
  gtest verify sinks test_cuda_kernels 'CudaKernels.SinkGradient*'
  gtest verify cudnn_mla_softcap test_cudnn_graphs 'CudnnViews.ValueHeadDimAndSoftcap*'
  # --kernel auto with cuDNN beside the sm_90a kernels, and timing the fused backward against
  # the two passes (the switches as ctest sets them); the view epilogue on cuDNN's rows.
  local a="RINGATTN_HOPPER_BWD=auto RINGATTN_HOPPER_FWD=auto"
  gtest verify auto test_cuda_kernels 'CudaKernels.AutoRunsTheSm90a*' "$a"
  gtest verify auto test_cuda_kernels 'CudaKernels.ViewEpilogue*'
  gtest verify auto test_cuda_sparse 'CudaSparseKernels.AutoTimesTheFused*' "$a"
  gtest verify auto test_cuda_ring 'CudaRing.AutoTimesTheFused*' "$a"
  # A kernel that never finishes must end the wait through the device watchdog, naming the
  # kernel (the probe, released after), and a whole CLI run with one never released must end
  # with exit 3 (its process gone while the GPU still runs the kernel).
  gtest verify device_wait test_cuda_kernels 'CudaDeviceWait.*'
  gtest verify device_wait test_cli_cuda 'CliCudaRun.AKernelThatNeverFinishes*'
  # (The auto items above also check that auto times only the forms verified_forms.hpp
  # lists, with a note for each left out: on a GPU the table is the only source.)
}

# The established suite: each binary in groups (by suite, from the runs so far: none over
# 30 s on an H200), and a last group with every test no group names, so nothing is missed.
test_groups() {
  case "$1" in
    test_cuda_kernels)
      echo 'Golden/*:Configs/*:CudaSharedMemory.*'; echo 'Shapes/*'; echo 'CudaKernels.*'
      echo 'CudaMemory.*'; echo 'CudaHopper.*' ;;
    test_cuda_ring)
      echo 'CudaRing.*:CudaRingEmulated.*'; echo 'Golden/*:Random/*'; echo 'Features/*'
      echo 'Partials/*:Hopper/*'; echo 'Patterns/*:CudaSparseRing*' ;;
    *) echo '*' ;;
  esac
}
plan_tests() {
  local t g groups filter_var
  for t in ${TESTS:-test_cuda_kernels test_cuda_sparse test_cli_cuda test_nccl test_cuda_ring \
    test_job_cuda test_cudnn_graphs}; do
    filter_var="FILTER_$t"
    if [ -n "${!filter_var:-}" ]; then
      gtest tests "" "$t" "${!filter_var}"
      continue
    fi
    groups=$(test_groups "$t")
    while read -r g; do gtest tests "" "$t" "$g"; done <<<"$groups"
    [ "$groups" = '*' ] || gtest tests "" "$t" "*-$(echo "$groups" | paste -sd:)"
  done
  # Ordering races between streams show as rare wrong answers: the ring and distributed
  # block-sparse tests again, REPEAT times (0 skips them).
  if [ "$REPEAT" -gt 0 ]; then
    add gtest tests "" test_cuda_ring \
      'Patterns/CudaSparseRing.*:CudaSparseRingRuns.*:Random/CudaRingRandom.*:CudaRing.Shared*' \
      "" $((TEST_TIMEOUT_S * REPEAT)) "--gtest_repeat=$REPEAT --gtest_brief=1" "" "$MIN_START_S"
  fi
}

plan_sanitize() {
  local t api="--report-api-errors no"
  # The new forms first: the fused backward's stats and drain warps, named barriers and bulk
  # reductions, and its wide form's two consumer warpgroups.
  for t in memcheck racecheck; do
    sanitize sanitize fused $t test_cuda_kernels 'CudaHopper.Backward*' RINGATTN_HOPPER_BWD=fused
  done
  for t in memcheck racecheck; do
    sanitize sanitize fused_wide $t test_cuda_kernels 'CudaHopper.Backward*' \
      RINGATTN_HOPPER_BWD=fused_wide
  done
  # NCCL's communicator init probes kernel images for other architectures and gets
  # cudaErrorNoKernelImageForDevice back, by design; API errors are not reported where a
  # ring runs (ours are checked by RINGATTN_CUDA_CHECK and fail the test), memory errors are.
  sanitize sanitize cudnn_ring memcheck test_cuda_ring 'CudaRing.Cudnn*' "" "$api"
  for t in memcheck racecheck; do
    sanitize sanitize sinks $t test_job_cuda 'EngineCuda.Sinks*' "" "$api"
  done
  # The fused form at 192/128 (its own sdQ and kDqFree, which the emulator's sweep does not
  # catch missing there): racecheck.
  sanitize sanitize hopper_value_dim racecheck test_cuda_kernels 'CudaHopper.ValueHeadDim*' \
    RINGATTN_HOPPER_BWD=fused
  # Then as before: memcheck over the golden cases and the properties; racecheck (slower)
  # over the golden forward/backward of the native kernels, which exercise every
  # shared-memory stage.
  sanitize sanitize kernels memcheck test_cuda_kernels 'Golden/*:CudaKernels.*:-*OutOfMemory*' ""
  sanitize sanitize sparse memcheck test_cuda_sparse '*' ""
  sanitize sanitize ring memcheck test_cuda_ring \
    'Golden/CudaRingGolden.*:Patterns/CudaSparseRing.*:CudaRing.HeadDim256*' "" "$api"
  sanitize sanitize native racecheck test_cuda_kernels 'Golden/CudaGolden.Native*' ""
}

plan_hopper() {
  # The sm_90a kernels as they run by default, with auto's choices and the ring's cuDNN steps.
  gtest hopper sm90a test_cuda_kernels 'CudaHopper.*:CudaKernels.AutoRunsTheSm90a*:CudaKernels.ViewEpilogue*'
  gtest hopper sm90a test_cuda_sparse '*Hopper*:CudaSparseKernels.AutoTimesTheFused*'
  gtest hopper sm90a test_cuda_ring '*Hopper*:CudaRing.Cudnn*:CudaRing.AutoTakesCudnn*:CudaRing.AutoTimesTheFused*'
  gtest hopper sm90a test_cli_cuda '*Hopper*'
  plan_fused hopper
  plan_fused_wide hopper
  # The dense forward's ping-pong kernel in 64- and 128-key steps.
  local p
  for p in 1 2; do
    gtest hopper "pingpong$p" test_cuda_kernels 'CudaHopper.Forward*:CudaHopper.PlanWithKernelHopper*' \
      "RINGATTN_HOPPER_PINGPONG=$p"
  done
  plan_qregs hopper
  fn hopper ab "hopper_ab.py (every variant)" $((${HOPPER_BUDGET_S:-240} + 60)) \
    "run_ab $(IFS=,; echo "${AB_ALL[*]}") 64,128,256 ${HOPPER_BUDGET_S:-240} ${QUICK:+quick}" \
    "sm90a" 60
}

AB_ALL=(native cudnn hopper hopper-fused hopper-fusedwide hopper-fusedov hopper-fusedwideov
  hopper-plain hopper-overlap hopper-1blk hopper-pingpong hopper-pingpong128 hopper-qregs)
plan_ab() {
  fn ab ab "hopper_ab.py" $((${AB_BUDGET_S:-120} + 40)) \
    "run_ab ${AB_VARIANTS:-cudnn,hopper,hopper-fused,hopper-fusedwide,hopper-fusedwideov} ${AB_HEAD_DIMS:-128} ${AB_BUDGET_S:-120} quick" \
    "" 60
}
plan_flex() {
  fn flex flex "flex_sparse.py" "${FLEX_TIMEOUT_S:-$((${FLEX_BUDGET_S:-120} + 60))}" run_flex "" 60
}
plan_ring() {
  fn ring ring "ring_bench.py" $((${RING_BUDGET_S:-150} + 60)) \
    "run_ring ${RING_KERNELS:-hopper,cudnn,auto}" "" 60
}
plan_dilated() {
  fn dilated dilated "run_bench.py --attention dilated" $((${DILATED_BUDGET_S:-120} + 60)) \
    run_dilated cudnn_dilated_bwd 60
}
plan_sinks() {
  fn sinks sinks "sinks_cost.py" $((${SINKS_BUDGET_S:-90} + 40)) run_sinks sinks 60
}
plan_mla() {
  fn mla mla "mla_cost.py" $((${MLA_BUDGET_S:-90} + 40)) run_mla mla_softcap 60
}
plan_bench() {
  fn bench ceilings "ceilings.py" 90 run_ceilings
  fn bench bench "run_bench.py" $((${BUDGET_S:-420} + 90)) run_sweep "" 60
}
plan_python() { fn python python "the Python package" "${PY_TIMEOUT_S:-300}" run_python; }
plan_builds() { fn builds builds "builds_ab.py, then nsys" 400 run_builds "" 60; }
plan_profile() {
  local spec
  if ! command -v ncu >/dev/null; then
    fn profile profile "ncu" 10 "no_tool ncu"
    return
  fi
  for spec in "fwd:hopper_fwd_kernel:0" "fwd:hopper_fwd_pingpong_kernel:2" \
    "bwd:hopper_bwd_dq_kernel:0" "bwd:hopper_bwd_dkdv_kernel:0"; do
    fn profile profile "ncu ${spec//:/ }" "${PROFILE_TIMEOUT_S:-90}" "run_profile ${spec//:/ }"
  done
}

for stage in "${STAGES[@]}"; do
  case "$stage" in
    check) plan_tests; plan_sanitize ;;
    ring+bench) plan_ring; plan_bench ;;
    all) plan_verify; plan_tests; plan_sanitize; plan_ring; plan_bench ;;
    *) "plan_$stage" ;;
  esac
done

# ---- running them -------------------------------------------------------------------------

stage_log() {
  case "$1" in
    tests) echo "$OUT/tests.log" ;;
    sanitize) echo "$OUT/sanitizer.log" ;;
    hopper) echo "$OUT/hopper_tests.log" ;;
    profile) echo "$OUT/profile.txt" ;;
    *) echo "$OUT/$1.log" ;;
  esac
}

# A filter with more tests left out: gtest takes POSITIVE[-NEGATIVE], patterns joined by ':'.
filter_less() {
  if [ -z "$2" ]; then echo "$1"
  elif [[ $1 == *-* ]]; then echo "$1:$2"
  else echo "$1-$2"; fi
}

# bounded COMMAND...: under `timeout`, with what is left of the current item's time.
bounded() {
  local t=$((ITEM_END - $(date +%s)))
  [ "$t" -ge 1 ] || return 124
  timeout -k 5 "$t" "$@"
}
# The --budget-s of a benchmark: its own budget, cut to the item's time less one row's
# overrun (the scripts check their budget before each row, so the last row may run past it).
bench_budget() {
  local t=$((ITEM_END - $(date +%s))) margin
  margin=$((t / 5 > 20 ? t / 5 : 20))
  min "$1" $((t - margin > 10 ? t - margin : 10))
}
note() { ITEM_NOTE="${ITEM_NOTE:+$ITEM_NOTE; }$*"; }
hung() { [ -n "$1" ] && [ -n "${HUNG[$1]:-}" ]; }
# KEPT: a comma list less the entries whose form hung (each entry NAME or NAME=FORM), with a
# note for each left out. (A global, not an echo: a $(...) subshell would lose the note.)
drop_hung() {
  local keep=() e
  for e in ${1//,/ }; do
    if [ "${e#*=}" != "$e" ] && hung "${e#*=}"; then
      note "left out ${e%%=*}: ${e#*=} hung"
    else
      keep+=("${e%%=*}")
    fi
  done
  KEPT=$(IFS=,; echo "${keep[*]:-}")
}

run_ab() {  # VARIANTS HEAD_DIMS BUDGET [quick]
  local v forms=()
  for v in ${1//,/ }; do
    case "$v" in
      hopper-fused) forms+=("$v=fused") ;;
      hopper-fusedwide) forms+=("$v=fused_wide") ;;
      hopper-fusedov) forms+=("$v=fused") ;;
      hopper-fusedwideov) forms+=("$v=fused_wide") ;;
      hopper-qregs) forms+=("$v=qregs") ;;
      hopper-pingpong) forms+=("$v=pingpong1") ;;
      hopper-pingpong128) forms+=("$v=pingpong2") ;;
      *) forms+=("$v") ;;
    esac
  done
  drop_hung "$(IFS=,; echo "${forms[*]}")"
  bounded python3 bench/gpu/hopper_ab.py --gpu-bench "$CARRY/bin/gpu_bench" --out "$OUT" \
    --budget-s "$(bench_budget "$3")" --variants "$KEPT" --head-dims "$2" ${4:+--quick}
}
run_flex() {
  drop_hung "hopper,hopper-fused=fused,hopper-fusedwide=fused_wide,native"
  bounded python3 bench/gpu/flex_sparse.py --cli "$CARRY/bin/ringattn" --out "$OUT" \
    --seq-len "${FLEX_SEQ_LEN:-32768}" --budget-s "$(bench_budget "${FLEX_BUDGET_S:-120}")" \
    --kernels "$KEPT"
}
run_ring() {  # KERNELS
  local k forms=()
  # auto on the ring times cuDNN's steps too: it goes with them.
  for k in ${1//,/ }; do
    case "$k" in
      cudnn) forms+=("cudnn=cudnn_ring") ;;
      auto) if hung cudnn_ring; then forms+=("auto=cudnn_ring"); else forms+=("auto=auto"); fi ;;
      *) forms+=("$k") ;;
    esac
  done
  drop_hung "$(IFS=,; echo "${forms[*]}")"
  bounded python3 bench/gpu/ring_bench.py --cli "$CARRY/bin/ringattn" --out "$OUT" \
    --budget-s "$(bench_budget "${RING_BUDGET_S:-150}")" --kernels "$KEPT"
}
run_dilated() {
  bounded python3 bench/gpu/run_bench.py --gpu-bench "$CARRY/bin/gpu_bench" --out "$OUT" \
    --attention dilated --quick --skip-max-n --budget-s "$(bench_budget "${DILATED_BUDGET_S:-120}")"
}
run_sinks() {
  bounded python3 bench/gpu/sinks_cost.py --cli "$CARRY/bin/ringattn" --out "$OUT" \
    --budget-s "$(bench_budget "${SINKS_BUDGET_S:-90}")"
}
run_mla() {
  bounded python3 bench/gpu/mla_cost.py --cli "$CARRY/bin/ringattn" --out "$OUT" \
    --budget-s "$(bench_budget "${MLA_BUDGET_S:-90}")"
}
run_ceilings() {
  bounded python3 bench/gpu/ceilings.py >"$OUT/ceilings.json"
  local rc=$?
  cat "$OUT/ceilings.json"
  return "$rc"
}
run_sweep() {
  local budget max_n=()
  budget=$(bench_budget "${BUDGET_S:-420}")
  # The max-N search may take minutes more: only where the item has them.
  if [ -n "${SKIP_MAX_N:-}" ] || [ $((ITEM_END - $(date +%s))) -lt $((budget + 300)) ]; then
    max_n=(--skip-max-n)
  fi
  bounded python3 bench/gpu/run_bench.py --gpu-bench "$CARRY/bin/gpu_bench" --out "$OUT" \
    --budget-s "$budget" ${QUICK:+--quick} ${max_n[@]+"${max_n[@]}"}
}

# The Python package on CUDA tensors (python/tests/test_cuda.py, test_attention.py): needs a
# ringattn wheel for the image's Python carried in .gpu-carry (built where that Python's
# headers are), or the carried kit linked here; without either it says what the image offers.
run_python() {
  echo "== python"; python3 --version
  bounded python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== headers and compilers"
  local inc tag wheel
  inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  echo "$inc"; ls "$inc/Python.h" 2>&1
  command -v g++ c++ nvcc cmake ninja 2>&1
  tag=$(python3 -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
  wheel=$(find "$ROOT/.gpu-carry" -maxdepth 1 -name "ringattn-*-$tag-*.whl" 2>/dev/null | head -1)
  rm -rf /tmp/pyringattn
  if [ -n "$wheel" ]; then
    bounded python3 -m pip install -q --no-deps --target /tmp/pyringattn "$wheel" || return 1
  elif [ -d "$CARRY/py" ]; then
    echo "== the extension, linked here from the carried kit"
    bounded bash bench/gpu/py_kit_build.sh "$CARRY/py" "$ROOT" /tmp/pyringattn || return 1
  fi
  if [ ! -d /tmp/pyringattn/ringattn ]; then
    echo "SKIPPED: the Python GPU tests: no $tag ringattn wheel in .gpu-carry and no kit to link one"
    return 1
  fi
  # shellcheck disable=SC2086  # PY_TESTS is a list of paths
  PYTHONPATH=/tmp/pyringattn bounded python3 -m pytest -q -p no:cacheprovider -rs \
    ${PY_TESTS:-python/tests/test_cuda.py python/tests/test_attention.py}
}

# A regression's bisection: the same rows through several gpu_bench builds, interleaved.
run_builds() {
  local args=(--build "carried=$CARRY/bin/gpu_bench") b rc nsys
  # Packed as .gpu-carry/variants.tar.xz (the carry's 64 MiB), unpacked beside the build.
  if [ -f "$ROOT/.gpu-carry/variants.tar.xz" ]; then
    bounded tar -xJf "$ROOT/.gpu-carry/variants.tar.xz" -C "$CARRY"
  fi
  for b in "$CARRY"/variants/gpu_bench_*; do
    [ -x "$b" ] && args+=(--build "${b##*/gpu_bench_}=$b")
  done
  # shellcheck disable=SC2086  # BUILDS_ARGS is a list of options
  bounded python3 bench/gpu/builds_ab.py --out "$OUT" "${args[@]}" ${BUILDS_ARGS:-}
  rc=$?
  # Where the carried build's backward time goes, kernel by kernel, where the image has nsys.
  nsys=$(command -v nsys || find /usr/local/cuda/bin /opt/nvidia/nsight-systems -name nsys \
    -type f 2>/dev/null | head -1)
  if [ -n "$nsys" ]; then
    ITEM_END=$(min "$ITEM_END" $(($(date +%s) + 120))) bounded "$nsys" profile -t cuda \
      -o /tmp/ringattn-nsys -f true --stats=true "$CARRY/bin/gpu_bench" --seq-len 16384 \
      --batch 1 --heads 16 --head-dim 128 --attention dense --kernel hopper --pass bwd \
      --warmup 2 --iters 10 >"$OUT/builds_nsys.txt" 2>&1
    grep -A25 "cuda_gpu_kern_sum" "$OUT/builds_nsys.txt" | cut -c1-220
  else
    echo "device_run: no nsys in the image: no per-kernel split"
  fi
  return "$rc"
}

# Where the Hopper kernels' time goes: ncu's sections for one launch of a kernel of the dense
# forward (D = 128) or backward. Containers may refuse the counters (ERR_NVGPUCTRPERM): then
# the log says so.
run_profile() {  # PASS KERNEL PINGPONG
  RINGATTN_HOPPER_PINGPONG=$3 bounded ncu --kernel-name-base mangled --kernel-name "regex:$2" \
    --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    "$CARRY/bin/gpu_bench" --seq-len 16384 --batch 1 --heads 16 --head-dim 128 \
    --attention dense --kernel hopper --warmup 0 --iters 1 --pass "$1" >"$WORK/ncu.txt" 2>&1
  local rc=$?
  cat "$WORK/ncu.txt"
  echo "== the lines that matter"
  grep -E "ERR_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|==WARNING==|==ERROR==" \
    "$WORK/ncu.txt" | head -20
  return "$rc"
}
no_tool() { echo "device_run: no $1 in the image"; return 1; }

# A test skipped for want of a GPU means nothing ran; one that needs two GPUs skips here, and
# the Hopper kernel's tests skip, saying why, on a GPU that is not an sm_90.
ALLOWED_SKIPS="needs [a-z0-9]+ GPUs|Hopper forward cannot run"

# Runs item $1 and sets its result: PASS, FAIL, HANG (a test group past its own limit),
# TIMEOUT (a sanitizer run or a benchmark past its own limit) or STOPPED (cut by the deadline).
run_item() {
  local i=$1 lim=$2 rc log envs first count skips cmd=() filter hung_test=""
  log=$(stage_log "${I_STAGE[i]}")
  ITEM_LOG=$WORK/item.log
  ITEM_NOTE=""
  ITEM_END=$(($(date +%s) + lim))
  read -ra envs <<<"RINGATTN_DEVICE_RUN=1 ${I_ENV[i]}"
  filter=${I_FILTER[i]}
  if [ "${I_KIND[i]}" != fn ]; then
    # Tests that hung without a switch (or whose form did) are not run again anywhere; those
    # verify ran are not run again by the tests stage.
    local less=${EXCL_HUNG[${I_BIN[i]}]:-}
    [ "${I_STAGE[i]}" != tests ] || less="$less${less:+${EXCL_RAN[${I_BIN[i]}]:+:}}${EXCL_RAN[${I_BIN[i]}]:-}"
    filter=$(filter_less "$filter" "$less")
    [ -z "$less" ] || note "less $(($(tr -cd : <<<"$less" | wc -c) + 1)) pattern(s) run or hung before (the log has them)"
  fi
  case "${I_KIND[i]}" in
    gtest)
      # shellcheck disable=SC2206  # the repeat options are words
      cmd=("$CARRY/bin/${I_BIN[i]}" --gtest_color=no "--gtest_filter=$filter" ${I_ARG[i]}) ;;
    sanitize)
      # shellcheck disable=SC2206  # the tool and its options are words
      cmd=(compute-sanitizer ${I_ARG[i]} --error-exitcode 9 --print-limit 20
        "$CARRY/bin/${I_BIN[i]}" --gtest_color=no "--gtest_filter=$filter") ;;
  esac
  echo "== ${I_DESC[i]}" >>"$log"
  [ "$filter" = "${I_FILTER[i]}" ] || echo "== (less what ran or hung before: --gtest_filter='$filter')" >>"$log"
  local begin
  begin=$(date +%s)
  if [ "${I_KIND[i]}" = fn ]; then
    # shellcheck disable=SC2086  # the function's name and its arguments
    ${I_ARG[i]} >"$ITEM_LOG" 2>&1
  else
    env "${envs[@]}" timeout -k 5 "$lim" "${cmd[@]}" >"$ITEM_LOG" 2>&1
  fi
  rc=$?
  I_SECS[i]=$(($(date +%s) - begin))
  cat "$ITEM_LOG" >>"$log"
  count=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran.*/\1/p' "$ITEM_LOG" | tail -1)
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    if [ "$lim" -lt "${I_LIMIT[i]}" ]; then
      I_RESULT[i]=STOPPED; note "cut by the deadline after ${I_SECS[i]} s"
    elif [ "${I_KIND[i]}" = gtest ]; then
      I_RESULT[i]=HANG; note "no end within $lim s"
      [ -z "${I_FORM[i]}" ] || HUNG[${I_FORM[i]}]=${I_DESC[i]}
      # The test that hung: the last one gtest started and never ended (none known where it
      # hung before its first test, or under --gtest_brief).
      hung_test=$(sed -n 's/^\[ RUN      \] \([^ ]*\).*/\1/p' "$ITEM_LOG" | tail -1)
      if [ -n "$hung_test" ] &&
        ! grep -qF -e "[       OK ] $hung_test " -e "[  FAILED  ] $hung_test " "$ITEM_LOG"; then
        note "in $hung_test"
      else
        hung_test=""
      fi
    else
      I_RESULT[i]=TIMEOUT; note "no end within $lim s"
    fi
  elif [ "$rc" -eq 0 ]; then
    I_RESULT[i]=PASS
    skips=$(grep "SKIPPED: " "$ITEM_LOG" | grep -vE "$ALLOWED_SKIPS" | head -1)
    if [ -n "$skips" ]; then
      I_RESULT[i]=FAIL; note "skipped for want of a GPU, so nothing was verified: $skips"
    fi
  else
    I_RESULT[i]=FAIL
    case "$rc" in
      9) note "the sanitizer found errors" ;;
      126 | 127) note "cannot run (exit $rc)" ;;
      1) ;;
      *) note "exit $rc" ;;
    esac
    # Which tests failed, or a script's last word (its error, or why it could not run).
    local failed
    failed=$(sed -n 's|^\[  FAILED  \] \([A-Za-z0-9_/]*\.[A-Za-z0-9_/.]*\).*|\1|p' "$ITEM_LOG" |
      sort -u | head -3 | paste -sd' ')
    if [ -n "$failed" ]; then
      note "failed: $failed"
    elif [ "${I_KIND[i]}" = fn ]; then
      note "$(grep -v '^[[:space:]]*$' "$ITEM_LOG" | tail -1 | cut -c1-160)"
    fi
  fi
  if [ "${I_KIND[i]}" != fn ]; then
    case "$count" in
      "") [ "${I_RESULT[i]}" != PASS ] || note "no gtest summary" ;;
      0) note "no test matched (not in this build)" ;;
      *) note "$count tests" ;;
    esac
    grep -hoE "SKIPPED: needs [a-z0-9]+ GPUs" "$ITEM_LOG" | sort -u >>"$WORK/gpu_skips"
  fi
  # Tests that ran without a switch: verify's are not run again by the tests stage, and one
  # that hung (the test itself where gtest named it, else the whole filter) is not run again
  # by any later item, under a sanitizer least of all.
  if [[ ${I_ENV[i]} != *RINGATTN_HOPPER_* ]] && [ "${I_KIND[i]}" = gtest ]; then
    if [ "${I_STAGE[i]}" = verify ]; then
      EXCL_RAN[${I_BIN[i]}]="${EXCL_RAN[${I_BIN[i]}]:+${EXCL_RAN[${I_BIN[i]}]}:}${I_FILTER[i]}"
    fi
    if [ "${I_RESULT[i]}" = HANG ]; then
      EXCL_HUNG[${I_BIN[i]}]="${EXCL_HUNG[${I_BIN[i]}]:+${EXCL_HUNG[${I_BIN[i]}]}:}${hung_test:-${I_FILTER[i]}}"
    fi
  fi
  # A new form's first failing test again under memcheck: a TMA or wgmma fault names its
  # address. Short, and only where it leaves time for the items after it.
  if [ "${I_RESULT[i]}" = FAIL ] && [ "${I_KIND[i]}" = gtest ] && [ "$rc" -eq 1 ] &&
    { [ "${I_STAGE[i]}" = verify ] || [ "${I_STAGE[i]}" = hopper ]; } &&
    [ "${HOPPER_MEMCHECK:-1}" = 1 ]; then
    first=$(sed -n 's|^\[  FAILED  \] \([A-Za-z0-9_/]*\.[A-Za-z0-9_/.]*\).*|\1|p' "$ITEM_LOG" | head -1)
    if [ -n "$first" ] && [ "$(left)" -ge $((2 * MEMCHECK_RERUN_S)) ]; then
      echo "== memcheck ${I_BIN[i]} $first" >>"$log"
      env "${envs[@]}" timeout -k 5 "$MEMCHECK_RERUN_S" compute-sanitizer --tool memcheck \
        --print-limit 10 "$CARRY/bin/${I_BIN[i]}" --gtest_color=no --gtest_filter="$first" 2>&1 |
        tail -60 >>"$log"
      note "$first rerun under memcheck ($log)"
    elif [ -n "$first" ]; then
      note "no memcheck rerun of $first: $(left) s left"
    fi
  fi
  # What the device tool's output shows: one line an item, a benchmark's last lines.
  if [ "${I_KIND[i]}" = fn ]; then tail -n 8 "$ITEM_LOG"; fi
  I_NOTE[i]=$ITEM_NOTE
  printf '%-7s %4ss  %-8s %s%s\n' "${I_RESULT[i]}" "${I_SECS[i]}" "${I_STAGE[i]}" \
    "${I_DESC[i]}" "${I_NOTE[i]:+  -- ${I_NOTE[i]}}"
}

# summary.txt: rewritten after every item, so a call killed from outside still leaves it.
# Its status line comes first and again last (the device tool shows an output's tail).
write_summary() {
  local final=$1 i n=${#I_KIND[@]} passed=0 bad=0 not_run=0 status rerun=() s
  for ((i = 0; i < n; i++)); do
    case "${I_RESULT[i]}" in
      PASS) passed=$((passed + 1)) ;;
      "" | "NOT RUN") not_run=$((not_run + 1)) ;;
      RUNNING) ;;
      *) bad=$((bad + 1)) ;;
    esac
  done
  if [ "$final" = 1 ]; then
    status="device_run: exit $EXIT: $passed passed, $bad failed/hung/timed out, $not_run not run"
  else
    status="device_run: UNFINISHED (this file is rewritten after each item; the call ended before the last): $passed passed, $bad failed/hung/timed out, $not_run not run yet"
  fi
  {
    echo "$status"
    echo "stages ${STAGES[*]}; DEADLINE_S=$DEADLINE_S, TEST_TIMEOUT_S=$TEST_TIMEOUT_S; $(($(date +%s) - T0)) s"
    echo "carried build: $(head -1 "$CARRY/build_info.txt" 2>/dev/null)"
    echo
    echo "ran (result, seconds, stage, item -- notes):"
    for ((i = 0; i < n; i++)); do
      case "${I_RESULT[i]}" in "" | "NOT RUN") continue ;; esac
      printf '  %-7s %4ss  %-8s %s%s\n' "${I_RESULT[i]}" "${I_SECS[i]:-?}" "${I_STAGE[i]}" \
        "${I_DESC[i]}" "${I_NOTE[i]:+  -- ${I_NOTE[i]}}"
    done
    echo
    echo "did not run (stage, item -- why):"
    for ((i = 0; i < n; i++)); do
      case "${I_RESULT[i]}" in "" | "NOT RUN") ;; *) continue ;; esac
      printf '  %-8s %s  -- %s\n' "${I_STAGE[i]}" "${I_DESC[i]}" "${I_NOTE[i]:-not reached yet}"
      if [[ ${I_NOTE[i]} != *hung* ]] && [[ " ${rerun[*]:-} " != *" ${I_STAGE[i]} "* ]]; then
        rerun+=("${I_STAGE[i]}")
      fi
    done
    [ "$not_run" -gt 0 ] || echo "  (nothing)"
    if [ -s "$WORK/gpu_skips" ]; then
      echo; echo "skipped on one GPU:"; sort -u "$WORK/gpu_skips" | sed 's/^/  /'
    fi
    echo
    for ((i = 0; i < n; i++)); do
      [ "${I_RESULT[i]}" != HANG ] ||
        echo "HANG: ${I_DESC[i]} (form ${I_FORM[i]:-none}): no end within ${I_SECS[i]} s"
    done
    if [ "$final" = 1 ] && [ ${#rerun[@]} -gt 0 ]; then
      s=""; [ "$DEADLINE_S" = 480 ] || s="DEADLINE_S=$DEADLINE_S "
      echo "to run what the deadline left out: ${s}bash bench/gpu/device_run.sh ${rerun[*]}"
    fi
    echo "$status"
  } >"$OUT/summary.txt"
}

EXIT=1
declare -A LOG_STARTED=()
stage=""
stage_begin=$T0
for ((i = 0; i < ${#I_KIND[@]}; i++)); do
  if [ "${I_STAGE[i]}" != "$stage" ]; then
    [ -z "$stage" ] || echo "device_run: stage $stage took $(($(date +%s) - stage_begin)) s"
    stage=${I_STAGE[i]} stage_begin=$(date +%s)
    echo "== stage $stage ($(left) s left)"
    # Each log starts empty once a call (a stage named twice appends to its first run's).
    log=$(stage_log "$stage")
    [ -n "${LOG_STARTED[$log]:-}" ] || : >"$log"
    LOG_STARTED[$log]=1
  fi
  remaining=$(left)
  needs=""
  for f in ${I_NEEDS[i]} ${I_FORM[i]}; do hung "$f" && needs=$f && break; done
  if [ -n "$needs" ]; then
    I_RESULT[i]="NOT RUN" I_NOTE[i]="$needs hung: ${HUNG[$needs]}"
    # Nor does any later item run these tests where they run without a switch.
    if [ "${I_KIND[i]}" = gtest ] && [[ ${I_ENV[i]} != *RINGATTN_HOPPER_* ]]; then
      EXCL_HUNG[${I_BIN[i]}]="${EXCL_HUNG[${I_BIN[i]}]:+${EXCL_HUNG[${I_BIN[i]}]}:}${I_FILTER[i]}"
    fi
  elif [ "$remaining" -le 0 ]; then
    I_RESULT[i]="NOT RUN" I_NOTE[i]="the deadline (DEADLINE_S=$DEADLINE_S)"
  elif [ "$remaining" -lt "${I_MINSTART[i]}" ]; then
    I_RESULT[i]="NOT RUN" I_NOTE[i]="the deadline: $remaining s left, under the ${I_MINSTART[i]} s it starts with"
  else
    I_RESULT[i]=RUNNING
    write_summary 0
    run_item "$i" "$(min "${I_LIMIT[i]}" "$remaining")"
    write_summary 0
  fi
  [ "${I_RESULT[i]}" != "NOT RUN" ] ||
    printf '%-7s %4s   %-8s %s  -- %s\n' "NOT RUN" "" "${I_STAGE[i]}" "${I_DESC[i]}" "${I_NOTE[i]}"
done
echo "device_run: stage $stage took $(($(date +%s) - stage_begin)) s"
EXIT=0
for r in "${I_RESULT[@]}"; do [ "$r" = PASS ] || EXIT=1; done
write_summary 1
echo
cat "$OUT/summary.txt"
echo "device_run: results in $OUT"
exit $EXIT
