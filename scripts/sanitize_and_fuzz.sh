#!/usr/bin/env bash
# Sanitizer and fuzzing part of CI (called by scripts/test.sh; docs/RELIABILITY.md says what
# runs and why). Two clang builds, CPU only (no CUDA, NCCL or MPI), each in its own
# directory:
#   build-asan  AddressSanitizer + UndefinedBehaviorSanitizer (leaks included) and the
#               libFuzzer targets: the CPU test suite, the fuzzers' seed corpora, then every
#               fuzzer for a fixed time.
#   build-tsan  ThreadSanitizer: the same CPU test suite, whose threaded parts are the
#               communication thread, the watchdog, virtual ranks, the pattern cache and the
#               progress ticker. OpenMP's own synchronisation is made visible to TSan by
#               LLVM's Archer tool (libarcher, shipped with libomp), not suppressed.
# Any sanitizer report, crash, leak or broken fuzz invariant fails the script.
# Environment: RINGATTN_FUZZ_SECONDS (default 15) per fuzzer; RINGATTN_JOBS build and test
# jobs (default: the number of cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
jobs=${RINGATTN_JOBS:-$(nproc)}
fuzz_seconds=${RINGATTN_FUZZ_SECONDS:-15}
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++
  -DRINGATTN_WITH_CUDA=OFF -DRINGATTN_WITH_MPI=OFF -DRINGATTN_BUILD_BENCH=OFF)

# Both builds run the whole CPU suite (labels core, kernels, ring, sparse, cli: the unit
# tests, the virtual-rank tests and the CLI on virtual ranks); MPI, CUDA and Slurm are off
# in these builds, so their tests are not built. Why all of it: under ASan the suite takes
# about 2 to 4 minutes on 2 cores, under TSan about 1, and its targets must be built anyway
# for the CLI the tests start; see docs/RELIABILITY.md.
tests=(test_core test_kernels test_cli test_cli_virtual_ranks test_ring test_ring_virtual
  test_sparse)
not_here='_NOT_BUILT|_skipped|slurm'

# No sanitizer suppressions. LLVM libomp 14 loses team structures when a parallel region
# resizes its cached "hot" team (the thread-count determinism tests do that on purpose),
# which LSan rightly reports; KMP_HOT_TEAMS_MAX_LEVEL=0 makes libomp take teams from its
# pool instead, so nothing leaks (docs/RELIABILITY.md).
export ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# ignore_noninstrumented_modules: what Archer asks for; libomp and OpenBLAS are not
# instrumented, every ringattn source is.
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1

# --- ASan + UBSan ---------------------------------------------------------------------------
start=$SECONDS
cmake -S "$root" -B "$root/build-asan" "${common[@]}" -DRINGATTN_SANITIZE=address,undefined \
  -DRINGATTN_FUZZ=ON >/dev/null
cmake --build "$root/build-asan" -j "$jobs" --target "${tests[@]}" ringattn_fuzzers
asan_build_s=$((SECONDS - start))
start=$SECONDS
(cd "$root/build-asan" && KMP_HOT_TEAMS_MAX_LEVEL=0 \
  ctest --output-on-failure --timeout 900 -j "$jobs" -LE fuzz -E "$not_here")
(cd "$root/build-asan" && ctest --output-on-failure -L fuzz)
asan_test_s=$((SECONDS - start))

# --- TSan -------------------------------------------------------------------------------------
start=$SECONDS
cmake -S "$root" -B "$root/build-tsan" "${common[@]}" -DRINGATTN_SANITIZE=thread >/dev/null
cmake --build "$root/build-tsan" -j "$jobs" --target "${tests[@]}"
tsan_build_s=$((SECONDS - start))
archer=$(grep -m1 '^RINGATTN_ARCHER_LIBRARY:' "$root/build-tsan/CMakeCache.txt" | cut -d= -f2-)
if [ -z "$archer" ] || [ ! -f "$archer" ]; then
  echo "sanitize_and_fuzz.sh: libarcher (LLVM OpenMP's TSan tool) not found; install libomp-dev" >&2
  exit 1
fi
start=$SECONDS
# The CPU kernels' reruns under each forced vector variant and OpenBLAS (kernels_on_*,
# sparse_on_*) run under ASan and in the main suite, not here: their threads are the default
# run's (one OpenMP loop over tiles; the variant changes only the code inside a tile), and
# they were a third of TSan's test time.
echo "sanitize_and_fuzz.sh: TSan runs the suite but the CPU-variant reruns (kernels_on_*, sparse_on_*)"
(cd "$root/build-tsan" && OMP_TOOL_LIBRARIES="$archer" ARCHER_OPTIONS=verbose=0 \
  ctest --output-on-failure --timeout 900 -j "$jobs" -E "$not_here|^(kernels|sparse)_on_")
tsan_test_s=$((SECONDS - start))

# --- libFuzzer --------------------------------------------------------------------------------
start=$SECONDS
work="$root/build-asan/fuzz-run"
rm -rf "$work"
mkdir -p "$work/artifacts"
total_execs=0
findings=0
summary=()
# The fuzzers run side by side, as many at a time as there are cores (each is one process of
# one thread): the same time each, in a fraction of the wall time. Each writes its exit status
# beside its log.
mapfile -t fuzzers < <(grep -v '^$' "$root/build-asan/fuzzers.txt")
running=0
for fuzzer in "${fuzzers[@]}"; do
  mkdir -p "$work/corpus/$fuzzer"
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  # The new inputs go to a scratch corpus; the committed seeds are only read.
  ( status=0
    "$root/build-asan/tests/fuzz/$fuzzer" -max_total_time="$fuzz_seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/$fuzzer-" \
      "$work/corpus/$fuzzer" "$root/tests/fuzz/corpus/$fuzzer" >"$work/$fuzzer.log" 2>&1 ||
      status=$?
    echo "$status" >"$work/$fuzzer.status" ) &
  running=$((running + 1))
done
wait
for fuzzer in "${fuzzers[@]}"; do
  log="$work/$fuzzer.log"
  status=$(cat "$work/$fuzzer.status" 2>/dev/null || echo 1)
  execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  execs=${execs:-0}
  crashes=$(find "$work/artifacts" -name "$fuzzer-*" | wc -l)
  total_execs=$((total_execs + execs))
  if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    findings=$((findings + (crashes > 0 ? crashes : 1)))
    echo "sanitize_and_fuzz.sh: $fuzzer FAILED (exit $status); its log:" >&2
    tail -n 60 "$log" >&2
  fi
  summary+=("$fuzzer: ${fuzz_seconds} s, $execs executions, corpus $(find "$work/corpus/$fuzzer" -type f | wc -l) new inputs, exit $status")
done
fuzz_s=$((SECONDS - start))

echo "sanitize_and_fuzz.sh: fuzzers (${fuzz_seconds} s each):"
printf '  %s\n' "${summary[@]}"
echo "sanitize_and_fuzz.sh: $total_execs fuzz executions in total, $findings findings"
echo "sanitize_and_fuzz.sh: ASan+UBSan build ${asan_build_s} s, tests ${asan_test_s} s;" \
  "TSan build ${tsan_build_s} s, tests ${tsan_test_s} s; fuzzing ${fuzz_s} s"
[ "$findings" -eq 0 ]
