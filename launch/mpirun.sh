#!/usr/bin/env bash
# Runs ringattn on one node over P MPI ranks with mpirun, one block of cores per rank.
#
#   launch/mpirun.sh -n 4 -- run --seq-len 65536 --attention dilated \
#       --segments 2048,4096,8192 --dilations 1,2,4 --backward --json
#
# Options (before --):
#   -n P                 ranks (default: 2)
#   -t T                 OpenMP threads per rank (default: cores / P, at least 1)
#   -b PATH              the ringattn binary (default: build/ringattn beside this script)
# Environment passed to every rank with -x: OMP_NUM_THREADS, OMP_PROC_BIND, OMP_PLACES, and
# every RINGATTN_* and NCCL_* variable that is set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ranks=2
threads=""
bin="$here/../build/ringattn"
while [ $# -gt 0 ]; do
  case "$1" in
    -n) ranks="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    -b) bin="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "launch/mpirun.sh: unknown option '$1' (options go before --)" >&2; exit 2 ;;
  esac
done
cores=$(nproc)
if [ -z "$threads" ]; then threads=$(( cores / ranks )); [ "$threads" -ge 1 ] || threads=1; fi
export OMP_NUM_THREADS="$threads" OMP_PROC_BIND=close OMP_PLACES=cores
args=(-n "$ranks")
if [ $(( ranks * threads )) -le "$cores" ]; then
  args+=(--map-by "slot:PE=$threads" --bind-to core)
else
  # More ranks x threads than cores (a laptop, CI): share cores rather than refuse.
  args+=(--oversubscribe --bind-to none)
fi
for v in OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES $(env | sed -n 's/^\(\(RINGATTN\|NCCL\)_[A-Za-z0-9_]*\)=.*/\1/p'); do
  args+=(-x "$v")
done
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun "${args[@]}" "$bin" "$@"
