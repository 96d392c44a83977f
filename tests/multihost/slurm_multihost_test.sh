#!/usr/bin/env bash
# A real two-node Slurm job (labels multihost, slurm): slurmctld on host h0, one slurmd on
# each of the namespace hosts h0 and h1 (one munged on h0, shared through its socket file), and
# `sbatch -N 2` of launch/ringattn.sbatch (srun --mpi=pmix), checked against float64.
# Then the fault: a rank of a second job is SIGKILLed, and the job must end FAILED.
# Usage: slurm_multihost_test.sh <ringattn binary> <source dir>
set -euo pipefail
bin=$1
src=$2
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
require_namespaces
for tool in munged slurmctld slurmd sbatch scontrol; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/deps.sh installs slurm-wlm and munge)"
done

cluster_up 2
work=$(mktemp -d /tmp/ringattn-slurm2.XXXXXX)
chmod 755 "$work"
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge.key"
# Every daemon runs inside a host's namespace, so that deleting the cluster (on exit, or by
# the next run's reap if this one was killed) ends them all.
"$cluster_sh" daemon "$cluster" 0 munged --force --key-file="$work/munge.key" --socket="$work/munge.socket" \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" --seed-file="$work/munged.seed"

mkdir -p "$work/state" "$work/spool-h0" "$work/spool-h1"
cat > "$work/slurm.conf" <<CONF
ClusterName=ringattn-multihost
SlurmctldHost=h0(10.77.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=h0 NodeAddr=10.77.0.1 CPUs=2 State=UNKNOWN
NodeName=h1 NodeAddr=10.77.0.2 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=h0,h1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# Both slurmds share this machine's /tmp, where the PMIx plugin makes a directory named
# after the job step: give each host its own (mpi.conf beside a copy of slurm.conf).
for h in 0 1; do
  mkdir -p "$work/conf-h$h" "$work/pmix-h$h"
  cp "$work/slurm.conf" "$work/conf-h$h/slurm.conf"
  echo "PMIxCliTmpDirBase=$work/pmix-h$h" > "$work/conf-h$h/mpi.conf"
done
export SLURM_CONF=$work/slurm.conf
"$cluster_sh" daemon "$cluster" 0 slurmctld -f "$SLURM_CONF"
"$cluster_sh" daemon "$cluster" 0 slurmd -f "$work/conf-h0/slurm.conf" || { tail -n 5 "$work"/slurm*.log; fail "slurmd on h0 did not start"; }
"$cluster_sh" daemon "$cluster" 1 slurmd -f "$work/conf-h1/slurm.conf" || { tail -n 5 "$work"/slurm*.log; fail "slurmd on h1 did not start"; }
state=""
for _ in $(seq 1 60); do
  state=$(on_host 0 sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [ "$state" = "idle " ] && break
  sleep 0.5
done
[ "$state" = "idle " ] || { tail -n 20 "$work"/slurm*.log; fail "the two nodes did not come up ($state)"; }
on_host 0 srun --mpi=list 2>&1 | grep -q pmix || skip "this Slurm has no PMIx plugin (srun --mpi=list)"
note "nodes: $(on_host 0 sinfo -h -N -o '%N %T %C' | tr '\n' ';')"

# Open MPI under srun: TCP between the hosts, on the cluster's subnet.
export RINGATTN_BIN=$bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=10.77.0.0/24
g=$src/tests/data/golden/g02_three_groups_causal
t0=$(now)
on_host 0 timeout 120 sbatch --wait --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 \
  --gpus-per-node=0 --output="$work/job.out" --chdir="$work" "$src/launch/ringattn.sbatch" run \
  --q "$g/q.npy" --k "$g/k.npy" --v "$g/v.npy" --dout "$g/dout.npy" --attention dilated \
  --segments 8,16,32 --dilations 1,2,4 --causal --check --iters 1 --warmup 0 --json \
  --out "$work/out.npy" || { cat "$work/job.out" 2>/dev/null; tail -n 20 "$work"/slurmd-*.log; fail "sbatch job failed"; }
cat "$work/job.out"
grep -q "world size 2" "$work/job.out" || fail "the job did not run on 2 ranks"
for r in 0 1; do
  grep -q "rank $r: host h$r," "$work/job.out" || fail "rank $r did not run on host h$r"
done
grep -q -- "-> OK" "$work/job.out" || fail "check against the float64 reference"
[ -f "$work/out.npy" ] || fail "no output file"
note "two-node job OK in $(elapsed "$t0" "$(now)") s"

# A rank killed mid-run: the job must end, and Slurm must record it FAILED.
on_host 0 sbatch --parsable --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 \
  --output="$work/kill.out" --chdir="$work" "$src/launch/ringattn.sbatch" run --seq-len 4096 \
  --heads 4 --head-dim 64 --iters 500 --warmup 0 --timeout 60 --out "$work/kill.npy" > "$work/jobid"
job=$(cut -d';' -f1 "$work/jobid")
victim=""
for _ in $(seq 1 200); do
  for p in $(ip netns pids "$cluster-h1"); do
    [ "$(ps -o comm= -p "$p" 2>/dev/null)" = ringattn ] && victim=$p
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
[ -n "$victim" ] || { cat "$work/kill.out"; fail "the second job's rank 1 never started"; }
sleep 1
kill -9 "$victim"
t_kill=$(now)
jstate=""
for _ in $(seq 1 300); do
  jstate=$(on_host 0 scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
  case $jstate in PENDING | RUNNING | COMPLETING | "") sleep 0.1 ;; *) break ;; esac
done
note "job $jstate $(elapsed "$t_kill" "$(now)") s after rank 1 was killed"
[ "$jstate" = FAILED ] || { cat "$work/kill.out"; fail "job state $jstate, want FAILED"; }
[ ! -e "$work/kill.npy" ] || fail "the killed job wrote an output file"
echo "PASSED: two-node Slurm job matched float64; a killed rank ended its job FAILED"
