#!/usr/bin/env bash
# A real one-node Slurm on localhost (Debian's slurm-wlm, no systemd, no
# cgroups): submit slurm/cpu.sbatch, assert on its output and metrics; then
# preempt a job with `scancel --signal=USR1` and check it checkpointed,
# requeued itself (exit 75) and resumed; then run the GPU-node template (CPU
# workers) and both multi-node templates on the one node; then a 1-minute job
# with no signal that must stop itself before its time limit. Stops the
# daemons at the end.
# Needs root. Usage: bash tests/slurm/ci_slurm.sh [VENV]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=$(cd "${1:-$ROOT/.venv}" && pwd)
say() { echo "[slurm-ci] $*"; }
passed=0
ok() { passed=$((passed + 1)); say "ok: $*"; }
. "$ROOT/tests/slurm/munge_slurm.sh"
slurm_install
T=$(mktemp -d /tmp/ibtmpi-slurm.XXXXXX)
chmod 755 "$T"
export SLURM_CONF=$T/slurm.conf
cleanup() {
    rc=$?
    scontrol shutdown >/dev/null 2>&1 || true
    sleep 1
    pkill -f "slurmctld" >/dev/null 2>&1 || true
    pkill -f "slurmd" >/dev/null 2>&1 || true
    if [ "${STARTED_MUNGE:-0}" = 1 ]; then munge_stop; fi
    # the cluster's state and job outputs: gone after a pass, kept to read after a failure
    if [ "$rc" = 0 ]; then cd / && rm -rf "$T"; else say "logs and job outputs kept in $T"; fi
}
trap cleanup EXIT

# munge: own run dir and key, started as the munge user
munge_start

HOST=$(hostname -s)
CPUS=$(nproc)
mkdir -p "$T/state" "$T/spool-$HOST"
cat > "$SLURM_CONF" <<CONF
ClusterName=ibtmpici
SlurmctldHost=$HOST
$(slurm_conf_common "$T")
KillWait=10
NodeName=$HOST Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld
slurmd
for i in $(seq 1 60); do
    sinfo -h -o %T 2>/dev/null | grep -q idle && break
    sleep 1
done
sinfo
say "cluster up ($CPUS CPUs on $HOST)"

WORK=$T/work
mkdir -p "$WORK"
cd "$WORK"
"$VENV/bin/ibtmpi" prep synth data --n 1200 --size 16 --shards 2 --quiet
cat > run.toml <<CONF
[data]
path = "$WORK/data"
split_size = 40
batch = 16
[model]
layers = "tiny"
[algorithm]
name = "admm"
[run]
dir = "$WORK/run1"
passes = 2
threads = 1
CONF

wait_job() {   # wait until the job leaves the queue; print its final state
    local id=$1
    job_wait "$id" 300
    sacct -n -X -j "$id" -o State 2>/dev/null | head -1 | tr -d ' ' || true
}

# 1) the CPU template: 3 ranks (master + 2 workers), overcommitted on 2 CPUs
say "submitting slurm/cpu.sbatch"
id=$(sbatch --parsable --overcommit --export=ALL,IBTMPI_VENV=$VENV \
     "$ROOT/slurm/cpu.sbatch" run.toml)
wait_job "$id" >/dev/null
cat "ibtmpi-$id.out"
grep -q "final test accuracy" "ibtmpi-$id.out" || { say "FAIL: no final accuracy line"; exit 1; }
lines=$(wc -l < run1/metrics.jsonl)
[ "$lines" -ge 2 ] || { say "FAIL: metrics.jsonl has $lines lines"; exit 1; }
grep -q '"world_size": 3' run1/summary.json || { say "FAIL: not 3 ranks"; exit 1; }
ok "template ran with 3 ranks, $lines metrics lines"

# 2) preemption: SIGUSR1 to the job steps -> checkpoint, exit 75, requeue, resume
sed -e "s#run1#run2#" -e "s#passes = 2#passes = 300#" run.toml > long.toml
say "submitting a long job to preempt"
id=$(sbatch --parsable --overcommit --export=ALL,IBTMPI_VENV=$VENV \
     "$ROOT/slurm/cpu.sbatch" long.toml --set run.checkpoint_every=1000 --set run.timeline=true)
for i in $(seq 1 120); do
    [ -f run2/metrics.jsonl ] && [ "$(wc -l < run2/metrics.jsonl)" -ge 3 ] && break
    sleep 1
done
scancel --signal=USR1 "$id"
say "sent SIGUSR1 to job $id"
for i in $(seq 1 120); do
    grep -q "requeueing job" "ibtmpi-$id.out" 2>/dev/null && break
    sleep 1
done
# Slurm holds a requeued job until a BeginTime about two minutes ahead; CI
# does not wait for it.
job_release "$id"
for i in $(seq 1 120); do
    grep -q "resuming from" "ibtmpi-$id.out" 2>/dev/null && break
    sleep 1
done
grep -q "exit status 75" "ibtmpi-$id.out" || { cat "ibtmpi-$id.out"; say "FAIL: no exit 75"; exit 1; }
grep -q "requeueing job $id" "ibtmpi-$id.out" || { say "FAIL: not requeued"; exit 1; }
grep -q "resuming from" "ibtmpi-$id.out" || { cat "ibtmpi-$id.out"; say "FAIL: requeued job did not resume"; exit 1; }
ls run2/checkpoints
# run.timeline: the preempted job merged its 3 ranks' traces; the requeued
# job traces into a segment of its own
"$VENV/bin/python" - <<'PY' || { say "FAIL: preempted job's timeline"; exit 1; }
import json
doc = json.load(open("run2/timeline.json"))
pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
assert pids == {0, 1, 2}, pids
PY
for i in $(seq 1 60); do
    [ "$(ls run2/timeline | wc -l)" -ge 2 ] && break
    sleep 1
done
ls run2/timeline
[ "$(ls run2/timeline | wc -l)" -ge 2 ] || { say "FAIL: the requeued job wrote no timeline segment"; exit 1; }
scancel "$id" || true
ok "preempted job checkpointed, merged its timeline, requeued itself and resumed"

# 3) the other templates, shrunk to this one-node CPU cluster: the GPU node
# template with CPU workers, and both multi-node launch styles on one node
# (Slurm refuses --overcommit with --ntasks-per-node, so those get 2 ranks
# on the 2 CPUs). Each must finish the run with the ranks it asked for.
run_template() {   # name, run dir, ranks, sbatch options...
    local name=$1 dir=$2 ranks=$3; shift 3
    sed -e "s#run1#$dir#" run.toml > "$dir.toml"
    local id
    id=$(sbatch --parsable "$@" "$ROOT/slurm/$name" "$dir.toml")
    wait_job "$id" >/dev/null
    cat "ibtmpi-$id.out"
    grep -q "final test accuracy" "ibtmpi-$id.out" || { say "FAIL: $name: no final accuracy line"; exit 1; }
    grep -q "\"world_size\": $ranks" "$dir/summary.json" || { say "FAIL: $name: not $ranks ranks"; exit 1; }
    ok "$name ran with $ranks ranks"
}
run_template gpu-node.sbatch run3 3 --overcommit --ntasks=3 --cpus-per-task=1 \
    --gpus-per-node=0 --export=ALL,IBTMPI_VENV=$VENV,IBTMPI_DEVICE=cpu
# the same template with GPU workers: the CuPy stand-in (tests/standin: one
# "GPU" per node, kernels emulated on the host) makes `--device gpu` start
# under srun as on a GPU node: the master binds none, each worker its local
# GPU, and the block buffers go through pinned host memory
run_template gpu-node.sbatch run3g 3 --overcommit --ntasks=3 --cpus-per-task=1 \
    --gpus-per-node=0 --export=ALL,IBTMPI_VENV=$VENV,PYTHONPATH=$ROOT/tests/standin
"$VENV/bin/python" - <<'PY' || { say "FAIL: gpu-node with GPU workers: devices"; exit 1; }
import json
ranks = json.load(open("run3g/summary.json"))["environment"]["ranks"]
assert [r["device"] for r in ranks] == ["-", "gpu 0", "gpu 0"], ranks
PY
ok "gpu-node.sbatch with GPU workers (stand-in): master on the host, workers on GPU 0"
run_template multinode-srun.sbatch run4 2 --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
    --export=ALL,IBTMPI_VENV=$VENV,IBTMPI_SRUN_MPI=pmi2
run_template multinode-mpirun.sbatch run5 2 --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
    --export=ALL,IBTMPI_VENV=$VENV

# 4) preempting the mpirun template: --signal=B:USR1 style, the batch shell
# catches the signal and forwards it through mpirun to the ranks
sed -e "s#run1#run6#" -e "s#passes = 2#passes = 300#" run.toml > run6.toml
id=$(sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
     --export=ALL,IBTMPI_VENV=$VENV "$ROOT/slurm/multinode-mpirun.sbatch" run6.toml)
for i in $(seq 1 120); do
    [ -f run6/metrics.jsonl ] && [ "$(wc -l < run6/metrics.jsonl)" -ge 3 ] && break
    sleep 1
done
scancel -b --signal=USR1 "$id"
for i in $(seq 1 120); do
    grep -q "requeueing job" "ibtmpi-$id.out" 2>/dev/null && break
    sleep 1
done
scancel "$id" || true
grep -q "exit status 75" "ibtmpi-$id.out" || { cat "ibtmpi-$id.out"; say "FAIL: mpirun template: no exit 75"; exit 1; }
ls run6/checkpoints | grep -q ckpt- || { say "FAIL: mpirun template: no checkpoint"; exit 1; }
ok "mpirun template forwarded SIGUSR1 from the batch shell, checkpointed and requeued"

# 5) the run's own time limit, with no signal at all: the master reads the
# job's end (SLURM_JOB_END_TIME, or squeue on Slurm < 23.02) and stops every
# rank with a checkpoint before it (exit 75). --time=1 is Slurm's shortest.
sed -e "s#run1#run7#" -e "s#passes = 2#passes = 3000#" run.toml > run7.toml
id=$(sbatch --parsable --overcommit --ntasks=3 --time=1 --output="ibtmpi-%j.out" \
     --wrap="srun --mpi=pmi2 $VENV/bin/python -m ibtmpi train --config run7.toml")
say "job $id: 1 minute, no signal"
wait_job "$id" >/dev/null
grep -E "time limit|preempted|resuming|error" "ibtmpi-$id.out" | tail -5
grep -q "ibtmpi train: preempted: stopped by the time limit" "ibtmpi-$id.out" || \
    { tail -20 "ibtmpi-$id.out"; say "FAIL: the run did not stop itself before the limit"; exit 1; }
grep -q "exit status 75" "ibtmpi-$id.out" || { say "FAIL: time limit: no exit 75"; exit 1; }
ls run7/checkpoints | grep -q ckpt- || { say "FAIL: time limit: no checkpoint"; exit 1; }
ok "the run stopped itself with a checkpoint before the job's time limit"
say "slurm: $passed passed, 0 failed"
