#!/usr/bin/env bash
# Runs ON the lent GPU machine, from a copy of the repository, with the build that
# scripts/gpu_build_for_device.sh packed into .gpu-carry/ringattn-gpu.tar.xz (name
# `.gpu-carry` in the device tool's `carry`); it is unpacked to /tmp. Nothing is compiled.
#
#   bash bench/gpu/device_run.sh check   # the gpu-labelled tests (stage `tests`), then
#                                         # compute-sanitizer memcheck and racecheck over the
#                                         # kernel tests (stage `sanitize`)
#   bash bench/gpu/device_run.sh python  # the Python package on CUDA tensors (a carried
#                                         # wheel for the image's Python), or what it lacks
#   bash bench/gpu/device_run.sh bench   # the benchmark sweep (run_bench.py) and max N
#   bash bench/gpu/device_run.sh ring    # the ring and block-sparse benchmark (ring_bench.py)
#   bash bench/gpu/device_run.sh flex    # block-sparse against FlexAttention (flex_sparse.py)
#   bash bench/gpu/device_run.sh hopper  # the Hopper (sm_90a) kernels' tests, then their A/B
#                                         # against native and cuDNN, and the forward's
#                                         # variants: overlap, one block per SM, ping-pong
#                                         # (hopper_ab.py)
#   bash bench/gpu/device_run.sh builds  # gpu_bench builds against each other (builds_ab.py):
#                                         # the carried gpu_bench first, then every
#                                         # variants/gpu_bench_* in .gpu-carry/variants.tar.xz
#                                         # (BUILDS_ARGS adds
#                                         # builds_ab.py options, e.g. "--pass fwd --rows d128")
#   bash bench/gpu/device_run.sh profile # Nsight Compute (ncu, in the image) over the Hopper
#                                         # dense forward and backward kernels at D = 128:
#                                         # speed of light, warp stalls, the tensor pipe
#   bash bench/gpu/device_run.sh all     # check, ring, bench (may not fit one 10-minute call)
#   bash bench/gpu/device_run.sh tests python sanitize   # several stages, in that order
#
# One call for a 15-minute lease (about 7 minutes of device time; leaves room to rerun):
#   REPEAT=2 QUICK=1 BUDGET_S=150 SKIP_MAX_N=1 bash bench/gpu/device_run.sh tests python bench
#
# Issue 31 on an sm_90 (runs so far: bench/results/gpu-h100-20261126-353d64e,
# gpu-h200-20261126-a9aff03), in one call of about 5 minutes: where the Hopper forward's and
# backward's time goes (Nsight Compute), the Hopper tests and A/B, and block-sparse against
# Flex (its backward not re-measured since the backward's regression was undone):
#   QUICK=1 HOPPER_BUDGET_S=120 FLEX_BUDGET_S=70 FLEX_TIMEOUT_S=110 \
#     bash bench/gpu/device_run.sh profile hopper flex
#
# The first call on the next lent GPU (issues 46, 47, then 45): the gpu tests (attention sinks
# on every GPU path, EngineCuda.Sinks*; the ring's cuDNN steps, CudaRing.Cudnn*), the Python
# package on CUDA tensors (sinks with their gradient; the bf16 transformers models need
# transformers, which the image lacks, and skip saying so), then the Hopper tests with the
# fused backward and its wide form (RINGATTN_HOPPER_BWD=fused, fused_wide) and their A/B
# (hopper_ab.py's fused and fusedwide columns), then the ring's cuDNN rows:
#   QUICK=1 HOPPER_BUDGET_S=60 RING_BUDGET_S=140 bash bench/gpu/device_run.sh tests python hopper ring
#
# The GPU ring's cuDNN steps (--kernel cudnn, never run on a GPU before 5425c34): their gpu
# tests run in the hopper stage (CudaRing.Cudnn*); ring_bench.py's cudnn rows time them at
# P = 1, 2, 4 beside the sm_90a rows, which is what `auto` on the ring waits for:
#   QUICK=1 HOPPER_BUDGET_S=60 RING_BUDGET_S=140 bash bench/gpu/device_run.sh hopper ring
#
# Output under $OUT (the device tool's folder; /tmp/ringattn-gpu when unset): device.txt,
# tests.log, sanitizer.log, gpu_bench_rows.jsonl, gpu_bench_table.txt, ring_bench_rows.jsonl,
# ring_bench_table.txt, ceilings.json, hopper_tests.log, hopper_ab_rows.jsonl,
# hopper_ab_table.txt, flex_sparse_rows.jsonl, flex_sparse_table.txt, builds_ab_rows.jsonl,
# builds_ab_table.txt, profile.txt (each stage writes its own).
# Exit status: 0 when every stage run passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-/tmp/ringattn-gpu}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
ARCHIVE=$ROOT/.gpu-carry/ringattn-gpu.tar.xz
if [ ! -f "$ARCHIVE" ]; then
  echo "device_run: no carried build at $ARCHIVE (run scripts/gpu_build_for_device.sh here and carry .gpu-carry)"
  exit 2
fi
CARRY=/tmp/ringattn-carry
rm -rf "$CARRY" && mkdir -p "$CARRY"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$ARCHIVE" "$CARRY" ||
  { echo "device_run: cannot unpack $ARCHIVE"; exit 2; }
# NCCL and cuDNN come from the image's PyTorch wheels (nvidia-nccl-cu13, nvidia-cudnn-cu13).
WHEEL_LIBS=$(python3 - <<'PY' 2>/dev/null
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
export PATH="$PATH:/usr/local/cuda/bin"  # compute-sanitizer
{
  echo "== date"; date -u
  echo "== carried build"; cat "$CARRY/build_info.txt"
  echo "== nvidia-smi"; nvidia-smi
  echo "== compute-sanitizer"; compute-sanitizer --version 2>&1 | head -2
  echo "== profilers"; command -v nsys ncu 2>&1; ls /usr/local/cuda/bin 2>&1 | tr '\n' ' '; echo
  echo "== LD_LIBRARY_PATH"; echo "$LD_LIBRARY_PATH" | tr ':' '\n'
  echo "== libraries the binaries resolve"; ldd "$CARRY"/bin/* | grep -E "nccl|cudnn|openblas|cudart" | sort -u
  echo "== cudnn / nccl found"; ls $(echo "$WHEEL_LIBS" | tr ':' ' ') 2>/dev/null | grep -E "libcudnn.so|libnccl.so" 
} >"$OUT/device.txt" 2>&1
status=0

run_check() {
  : >"$OUT/tests.log"
  # test_job_cuda: the library API on the GPU (host staging, device tensors on the caller's
  # stream, virtual ranks); test_cudnn_graphs: the cudnn-frontend graphs against the image's
  # cuDNN; test_cuda_ring includes the per-step partials seam (CudaRingPartials).
  # TESTS narrows the list; FILTER_<test> (e.g. FILTER_test_cuda_ring) a test's gtest filter.
  for t in ${TESTS:-test_cuda_kernels test_cuda_sparse test_cli_cuda test_nccl test_cuda_ring \
    test_job_cuda test_cudnn_graphs}; do
    echo "== $t" | tee -a "$OUT/tests.log"
    from=$(( $(wc -l <"$OUT/tests.log") + 1 ))
    filter_var="FILTER_$t"
    timeout -k 5 "${TEST_TIMEOUT_S:-300}" "$CARRY/bin/$t" --gtest_color=no \
      --gtest_filter="${!filter_var:-*}" >>"$OUT/tests.log" 2>&1
    rc=$?
    [ $rc -le 1 ] || echo "$t exited with status $rc" | tee -a "$OUT/tests.log"
    tail -n +"$from" "$OUT/tests.log" | grep -E "^\[  (PASSED|FAILED) \]|tests? ran|^\[  SKIPPED \] [0-9]" | tail -4
    [ $rc -eq 0 ] || status=1
  done
  # Ordering races between streams show as rare wrong answers: the ring and distributed
  # block-sparse tests again, REPEAT times (default 5; 0 skips them).
  if [ "${REPEAT:-5}" -gt 0 ]; then
    echo "== test_cuda_ring, repeated" | tee -a "$OUT/tests.log"
    "$CARRY/bin/test_cuda_ring" --gtest_color=no --gtest_brief=1 --gtest_repeat="${REPEAT:-5}" \
      --gtest_filter='Patterns/CudaSparseRing.*:CudaSparseRingRuns.*:Random/CudaRingRandom.*:CudaRing.Shared*' \
      >>"$OUT/tests.log" 2>&1
    rc=$?
    echo "repeated ${REPEAT:-5} times: exit $rc" | tee -a "$OUT/tests.log"
    [ $rc -eq 0 ] || status=1
  fi
  # A test skipped for want of a GPU means nothing ran; one that needs two GPUs skips here.
  # (The Hopper kernel's tests skip, saying why, on a GPU that is not an sm_90.)
  if grep "SKIPPED: " "$OUT/tests.log" | grep -qvE "needs [a-z0-9]+ GPUs|Hopper forward cannot run"; then
    echo "device_run: tests were SKIPPED for want of a GPU, so nothing was verified:"
    grep "SKIPPED: " "$OUT/tests.log" | grep -vE "needs [a-z0-9]+ GPUs|Hopper forward cannot run" | head -3
    status=1
  fi
  grep -hE "SKIPPED: needs [a-z0-9]+ GPUs" "$OUT/tests.log" | sort -u
}

run_sanitize() {
  : >"$OUT/sanitizer.log"
  # memcheck over the golden cases and the properties; racecheck (slower) over the golden
  # forward/backward of the native kernels, which exercise every shared-memory stage.
  echo "== memcheck" | tee -a "$OUT/sanitizer.log"
  compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$CARRY/bin/test_cuda_kernels" --gtest_color=no \
    --gtest_filter='Golden/*:CudaKernels.*:-*OutOfMemory*' >>"$OUT/sanitizer.log" 2>&1
  rc=$?; tail -3 "$OUT/sanitizer.log"; [ $rc -eq 0 ] || status=1
  echo "== memcheck (block-sparse)" | tee -a "$OUT/sanitizer.log"
  compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$CARRY/bin/test_cuda_sparse" --gtest_color=no >>"$OUT/sanitizer.log" 2>&1
  rc=$?; tail -3 "$OUT/sanitizer.log"; [ $rc -eq 0 ] || status=1
  echo "== memcheck (GPU ring and distributed block-sparse)" | tee -a "$OUT/sanitizer.log"
  # NCCL's communicator init probes kernel images for other architectures and gets
  # cudaErrorNoKernelImageForDevice back, by design; API errors are not reported here (ours
  # are checked by RINGATTN_CUDA_CHECK and fail the test), memory errors are.
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    "$CARRY/bin/test_cuda_ring" --gtest_color=no \
    --gtest_filter='Golden/CudaRingGolden.*:Patterns/CudaSparseRing.*:CudaRing.HeadDim256*' \
    >>"$OUT/sanitizer.log" 2>&1
  rc=$?; tail -3 "$OUT/sanitizer.log"; [ $rc -eq 0 ] || status=1
  echo "== racecheck" | tee -a "$OUT/sanitizer.log"
  compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 20 \
    "$CARRY/bin/test_cuda_kernels" --gtest_color=no \
    --gtest_filter='Golden/CudaGolden.Native*' >>"$OUT/sanitizer.log" 2>&1
  rc=$?; tail -3 "$OUT/sanitizer.log"; [ $rc -eq 0 ] || status=1
  # The fused sm_90a backward (issue 45): its stats and drain warps, named barriers and bulk
  # reductions, under memcheck and racecheck (the dense, dilated-plan and block-sparse tests).
  for tool in memcheck racecheck; do
    echo "== $tool (fused sm_90a backward)" | tee -a "$OUT/sanitizer.log"
    RINGATTN_HOPPER_BWD=fused timeout -k 5 240 compute-sanitizer --tool $tool --error-exitcode 9 \
      --print-limit 20 "$CARRY/bin/test_cuda_kernels" --gtest_color=no \
      --gtest_filter='CudaHopper.Backward*' >>"$OUT/sanitizer.log" 2>&1
    rc=$?; tail -3 "$OUT/sanitizer.log"; [ $rc -eq 0 ] || status=1
  done
  # Its wide form (128-key blocks, two consumer warpgroups, D = 128) likewise.
  for tool in memcheck racecheck; do
    echo "== $tool (wide fused sm_90a backward)" | tee -a "$OUT/sanitizer.log"
    RINGATTN_HOPPER_BWD=fused_wide timeout -k 5 240 compute-sanitizer --tool $tool \
      --error-exitcode 9 --print-limit 20 "$CARRY/bin/test_cuda_kernels" --gtest_color=no \
      --gtest_filter='CudaHopper.Backward*' >>"$OUT/sanitizer.log" 2>&1
    rc=$?; tail -3 "$OUT/sanitizer.log"; [ $rc -eq 0 ] || status=1
  done
}

run_bench() {
  python3 bench/gpu/ceilings.py | tee "$OUT/ceilings.json" || status=1
  python3 bench/gpu/run_bench.py --gpu-bench "$CARRY/bin/gpu_bench" --out "$OUT" \
    --budget-s "$BUDGET_S" ${QUICK:+--quick} ${SKIP_MAX_N:+--skip-max-n} || status=1
}

# Issue 31's kernels on their first sm_90: their tests (dense, block-sparse, dilated; the
# plans and the CLI), then hopper_ab.py's table.
run_hopper() {
  : >"$OUT/hopper_tests.log"
  local hung=""
  # binary:filter[@VAR=value]: "$pp=1" and "$pp=2" run the dense forward's ping-pong kernel
  # (64- and 128-key steps), the last two the kernels with their resident tiles in registers.
  # AutoRunsTheSm90a…: one GPU's --kernel auto with cuDNN beside the sm_90a kernels (its
  # notes give both timings), never run on a GPU before b9b5f3a. CudaRing.Cudnn…: the ring's
  # steps on cuDNN (--kernel cudnn; windows and packed documents among them), never run on a
  # GPU before it landed; CudaRing.AutoTakesCudnn…: the ring's auto with cuDNN's steps and
  # stubbed timings; CudaKernels.ViewEpilogue…: prints what cuDNN returns for a view row
  # without keys, and checks the epilogue ignores it.
  pp="test_cuda_kernels:CudaHopper.Forward*:CudaHopper.PlanWithKernelHopper*@RINGATTN_HOPPER_PINGPONG"
  local qr="@RINGATTN_HOPPER_QREGS=1"
  # The fused backward (RINGATTN_HOPPER_BWD=fused), never run on a GPU before 0f505f3: dense,
  # dilated, block-sparse and the ring's steps; …AutoTimesTheFused…: --kernel auto timing it
  # against the two passes on block-sparse and the ring (their notes give both times).
  local fu="@RINGATTN_HOPPER_BWD=fused"
  # The wide fused backward (=fused_wide, D = 128), never run on a GPU before this landed.
  local fw="@RINGATTN_HOPPER_BWD=fused_wide"
  for spec in "test_cuda_kernels:CudaHopper.*:CudaKernels.AutoRunsTheSm90a*:CudaKernels.ViewEpilogue*" \
    "test_cuda_sparse:*Hopper*:CudaSparseKernels.AutoTimesTheFused*" \
    "test_cuda_ring:*Hopper*:CudaRing.Cudnn*:CudaRing.AutoTakesCudnn*:CudaRing.AutoTimesTheFused*" \
    "test_cuda_kernels:CudaHopper.Backward*:CudaHopper.PlanRunsDilated*$fu" \
    "test_cuda_sparse:*Hopper*$fu" "test_cuda_ring:*Hopper*$fu" \
    "test_cuda_kernels:CudaHopper.Backward*:CudaHopper.PlanRunsDilated*$fw" \
    "test_cuda_sparse:*KernelHopper*$fw" "test_cuda_ring:*Hopper*$fw" \
    "test_cli_cuda:*Hopper*" "$pp=1" "$pp=2" \
    "test_cuda_kernels:CudaHopper.*$qr" "test_cuda_sparse:*Hopper*$qr"; do
    t=${spec%%:*}
    filter=${spec#*:}
    # Never empty: "${a[@]}" of an empty array is an error under set -u before bash 4.4.
    env_set=(RINGATTN_DEVICE_RUN=1)
    case "$filter" in *@*) env_set+=("${filter##*@}"); filter=${filter%@*} ;; esac
    if [ -n "$hung" ]; then
      echo "== $t $filter ${env_set[*]:1}: not run, $hung timed out" | tee -a "$OUT/hopper_tests.log"; continue
    fi
    echo "== $t $filter ${env_set[*]:1}" | tee -a "$OUT/hopper_tests.log"
    # Never run on real sm_90a before: a hang must cost one binary's timeout, not the lease.
    from=$(( $(wc -l <"$OUT/hopper_tests.log") + 1 ))
    env "${env_set[@]}" timeout -k 5 "${HOPPER_TEST_TIMEOUT_S:-150}" "$CARRY/bin/$t" \
      --gtest_color=no --gtest_filter="$filter" >>"$OUT/hopper_tests.log" 2>&1
    rc=$?
    [ $rc -le 1 ] || echo "$t exited with status $rc" | tee -a "$OUT/hopper_tests.log"
    grep -E "^\[  (PASSED|FAILED) \]|SKIPPED: " "$OUT/hopper_tests.log" | tail -2
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && hung=$t
    if [ $rc -ne 0 ] && [ -z "$hung" ]; then
      status=1
      # The first failing test again under memcheck: a TMA or wgmma fault names its address.
      first=$(tail -n +"$from" "$OUT/hopper_tests.log" | sed -n 's|^\[  FAILED  \] \([A-Za-z0-9_/.]*\).*|\1|p' | head -1)
      if [ -n "$first" ] && [ "${HOPPER_MEMCHECK:-1}" = 1 ]; then
        echo "== memcheck $t $first" | tee -a "$OUT/hopper_tests.log"
        env "${env_set[@]}" timeout -k 5 90 compute-sanitizer --tool memcheck --print-limit 10 "$CARRY/bin/$t" \
          --gtest_color=no --gtest_filter="$first" 2>&1 | tail -60 >>"$OUT/hopper_tests.log"
      fi
    fi
  done
  [ -z "$hung" ] || { status=1; echo "device_run: no Hopper A/B: $hung timed out"; return; }
  python3 bench/gpu/hopper_ab.py --gpu-bench "$CARRY/bin/gpu_bench" --out "$OUT" \
    --budget-s "${HOPPER_BUDGET_S:-240}" ${QUICK:+--quick} || status=1
}

# Block-sparse against FlexAttention on this GPU, the image's PyTorch compiling Flex.
run_flex() {
  timeout -k 5 "${FLEX_TIMEOUT_S:-240}" python3 bench/gpu/flex_sparse.py --cli "$CARRY/bin/ringattn" \
    --out "$OUT" --seq-len "${FLEX_SEQ_LEN:-32768}" --budget-s "${FLEX_BUDGET_S:-180}" || status=1
}

# A regression's bisection: the same rows through several gpu_bench builds, interleaved.
run_builds() {
  local args=(--build "carried=$CARRY/bin/gpu_bench")
  # Packed as .gpu-carry/variants.tar.xz (the carry's 64 MiB), unpacked beside the build.
  [ -f "$ROOT/.gpu-carry/variants.tar.xz" ] && tar -xJf "$ROOT/.gpu-carry/variants.tar.xz" -C "$CARRY"
  for b in "$CARRY"/variants/gpu_bench_*; do
    [ -x "$b" ] && args+=(--build "${b##*/gpu_bench_}=$b")
  done
  # shellcheck disable=SC2086  # BUILDS_ARGS is a list of options
  python3 bench/gpu/builds_ab.py --out "$OUT" "${args[@]}" ${BUILDS_ARGS:-} || status=1
  # Where the carried build's backward time goes, kernel by kernel, where the image has nsys.
  local nsys
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$nsys" ]; then
    timeout -k 5 120 "$nsys" profile -t cuda -o /tmp/ringattn-nsys -f true --stats=true \
      "$CARRY/bin/gpu_bench" --seq-len 16384 --batch 1 --heads 16 --head-dim 128 --attention dense \
      --kernel hopper --pass bwd --warmup 2 --iters 10 >"$OUT/builds_nsys.txt" 2>&1
    grep -A25 "cuda_gpu_kern_sum" "$OUT/builds_nsys.txt" | cut -c1-220
  else
    echo "device_run: no nsys in the image: no per-kernel split"
  fi
}

# Where the Hopper kernels' time goes: ncu's sections for one launch of each kernel of the
# dense forward (D = 128, plain and ping-pong) and backward (the dQ and dK/dV passes).
# Containers may refuse the counters (ERR_NVGPUCTRPERM): then the log says so.
run_profile() {
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then
    echo "device_run: no ncu in the image: no profile"; status=1; return
  fi
  : >"$OUT/profile.txt"
  local bench_args=(--seq-len 16384 --batch 1 --heads 16 --head-dim 128 --attention dense
    --kernel hopper --warmup 0 --iters 1)
  for spec in "fwd:hopper_fwd_kernel:0" "fwd:hopper_fwd_pingpong_kernel:2" \
    "bwd:hopper_bwd_dq_kernel:0" "bwd:hopper_bwd_dkdv_kernel:0"; do
    IFS=: read -r pass kernel pingpong <<<"$spec"
    echo "== ncu $kernel (--pass $pass, RINGATTN_HOPPER_PINGPONG=$pingpong)" | tee -a "$OUT/profile.txt"
    RINGATTN_HOPPER_PINGPONG=$pingpong timeout -k 5 "${PROFILE_TIMEOUT_S:-90}" "$ncu" \
      --kernel-name-base mangled --kernel-name "regex:${kernel}" --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats \
      "$CARRY/bin/gpu_bench" "${bench_args[@]}" --pass "$pass" >>"$OUT/profile.txt" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || { echo "ncu exited with status $rc" | tee -a "$OUT/profile.txt"; status=1; }
  done
  grep -E "^== ncu|ERR_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|==WARNING==|==ERROR==" \
    "$OUT/profile.txt" | head -60
}

run_ring() {
  python3 bench/gpu/ring_bench.py --cli "$CARRY/bin/ringattn" --out "$OUT" \
    --budget-s "${RING_BUDGET_S:-240}" || status=1
}

# The Python package on CUDA tensors (python/tests/test_cuda.py, test_device_arrays.py):
# needs a ringattn wheel for the image's Python carried in .gpu-carry (built where that
# Python's headers are); without one it says what the image offers, for the next session.
run_python() {
  {
    echo "== python"; python3 --version; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    echo "== headers and compilers"; python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])"
    ls "$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")/Python.h" 2>&1
    command -v g++ c++ nvcc cmake ninja 2>&1
    tag=$(python3 -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
    wheel=$(ls "$ROOT"/.gpu-carry/ringattn-*-"$tag"-*.whl 2>/dev/null | head -1)
    rm -rf /tmp/pyringattn
    if [ -n "$wheel" ]; then
      python3 -m pip install -q --no-deps --target /tmp/pyringattn "$wheel" || status=1
    elif [ -d "$CARRY/py" ]; then
      echo "== the extension, linked here from the carried kit"
      bash bench/gpu/py_kit_build.sh "$CARRY/py" "$ROOT" /tmp/pyringattn || status=1
    fi
    if [ ! -d /tmp/pyringattn/ringattn ]; then
      echo "SKIPPED: the Python GPU tests: no $tag ringattn wheel in .gpu-carry and no kit to link one"
      status=1
    else
      PYTHONPATH=/tmp/pyringattn timeout "${PY_TIMEOUT_S:-300}" python3 -m pytest -q -p no:cacheprovider -rs \
        ${PY_TESTS:-python/tests/test_cuda.py python/tests/test_attention.py} || status=1
    fi
  } >"$OUT/python.log" 2>&1
  tail -n 5 "$OUT/python.log"
}

for stage in "${@:-all}"; do
  begin=$(date +%s)
  case "$stage" in
    tests) run_check ;;
    sanitize) run_sanitize ;;
    check) run_check; run_sanitize ;;
    python) run_python ;;
    bench) run_bench ;;
    hopper) run_hopper ;;
    ring) run_ring ;;
    flex) run_flex ;;
    builds) run_builds ;;
    profile) run_profile ;;
    ring+bench) run_ring; run_bench ;;
    all) run_check; run_sanitize; run_ring; run_bench ;;
    *) echo "device_run: unknown stage '$stage' (tests | sanitize | check | python | bench | ring | flex | builds | profile | ring+bench | hopper | all)"; exit 2 ;;
  esac
  echo "device_run: stage $stage took $(( $(date +%s) - begin )) s (status so far $status)"
done
echo "device_run: stages ${*:-all} finished with status $status; results in $OUT"
exit $status
