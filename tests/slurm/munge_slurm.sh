# Sourced by tests/slurm/ci_slurm.sh and tests/multinode/run.sh: Slurm and
# munge where they are missing (Debian's packages), and munged running.
# slurm_install: 0 when slurmctld and munged are there (installed if not).
# munge_start: munge's directories and key, munged started as the munge
# user unless one runs; sets STARTED_MUNGE=1 when it started it (the
# caller stops it then, with munge_stop); it answers when this returns 0.
# slurm_conf_common DIR: the slurm.conf lines both CI clusters share (root
# daemons, munge, no cgroups, requeue, a fresh first job id); DIR holds the
# state, spool (%n: per node), pid and log files.

slurm_install() {
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        echo "installing slurm-wlm and munge"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
}

# job_gone ID: true once Slurm no longer runs or holds job ID (finished, or
# purged: "Invalid job id"). A query that fails otherwise (a slurmctld busy
# on a loaded machine answers "Socket timed out") is not taken for "gone":
# taking it so ended the waits below early and failed the stage under load.
job_gone() {
    local out
    if out=$(squeue -h -j "$1" -o %T 2>&1); then
        [ -z "$out" ]
    else
        case "$out" in *"Invalid job id"*) return 0 ;; *) return 1 ;; esac
    fi
}

# job_wait ID SECONDS: until job_gone (1 when SECONDS pass first).
job_wait() {
    local i
    for i in $(seq 1 "$2"); do job_gone "$1" && return 0; sleep 1; done
    return 1
}

# job_release ID: a requeued job is held until a BeginTime about two
# minutes ahead; start it a few seconds from now instead, once it is held
# (up to 120 s: a loaded slurmctld may take a while to requeue it, or to
# answer). Not "now": slurmd revokes the killed run's credential with a
# time in whole seconds and refuses every credential of that job id made
# in the same second or before ("Killing non-startable batch job: Job
# credential revoked", the job then FAILED), which a restart within the
# second of the kill met on a loaded machine, 2 runs in 7 here.
job_release() {
    local i
    for i in $(seq 1 120); do
        squeue -h -j "$1" -o %r 2>/dev/null | grep -q BeginTime && \
            scontrol update JobId="$1" StartTime=now+5 >/dev/null 2>&1 && return 0
        sleep 1
    done
    return 1
}

# submit_started TEMPLATE OUTPUT CONFIG RUNDIR (tests/multinode/run.sh;
# the caller's ROOT, VENV, NODES and say()): sbatch a template job on NODES
# nodes, one rank each (UCX over the links' eth0; Hydra's call-back address
# on the node's link for mpirun; this venv), and print its id once it
# started training or ended. A job
# that ended at MPI start-up on the MPI stack's own failure (the templates'
# header: Slurm's PMI2 server reading one of MPICH's address messages in
# pieces under load, so UCX unpacks a cut address: "failed to unpack
# address, invalid bandwidth 0.00" or "Destination is unreachable") wrote
# nothing; it is submitted once more, and the log says so
# (tests/unit/test_slurm_helpers.py).
submit_started() {
    local tpl=$1 out=$2 cfg=$3 dir=$4 id try f why k
    for try in 1 2; do
        id=$(UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 HYDRA_IFACE=eth0 IBTMPI_VENV=$VENV \
             sbatch --parsable --nodes=$NODES --ntasks-per-node=1 --cpus-per-task=1 \
             --export=ALL --output="$out" "$ROOT/slurm/$tpl.sbatch" "$cfg" \
             --set run.dir="$dir")
        f=${out//%j/$id}
        for k in $(seq 1 300); do
            [ -s "$dir/metrics.jsonl" ] && break
            job_gone "$id" && break
            sleep 1
        done
        why=$(grep -ao "request not begin with 'cmd='\|failed to unpack address.*\|Destination is unreachable" \
              "$f" 2>/dev/null | head -1)
        if [ "$try" = 1 ] && [ ! -s "$dir/metrics.jsonl" ] && job_gone "$id" && [ -n "$why" ]; then
            say "slurm/$tpl.sbatch: the MPI stack failed to start ($why); submitting it once more" >&2
            continue
        fi
        break
    done
    echo "$id"
}

munge_up() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# munged stopped and gone: a pkill'd munged takes a moment to exit, and one
# still exiting when the next stage checks would pass for a running one.
munge_stop() {
    pkill -x munged 2>/dev/null || true
    for _ in $(seq 1 100); do pgrep -x munged >/dev/null || return 0; sleep 0.1; done
    pkill -9 -x munged 2>/dev/null || true
}

munge_start() {
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    STARTED_MUNGE=0
    munge_up && return 0
    # not answering: one may be exiting (or hung); start a fresh one
    munge_stop
    runuser -u munge -- munged --force
    STARTED_MUNGE=1
    for _ in $(seq 1 100); do munge_up && return 0; sleep 0.1; done
    echo "munged did not come up: $(tail -3 /var/log/munge/munged.log 2>/dev/null)" >&2
    return 1
}

slurm_conf_common() {
    local d=$1
    cat <<CONF
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool-%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd-%n.log
MailProg=/bin/true
MpiDefault=none
JobRequeue=1
# Fresh job ids per CI cluster: MPICH names its shared memory after the PMI
# job/step, and a stale segment of a killed "job 2" from an earlier cluster
# would make a new job 2 hang in MPI_Init.
FirstJobId=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000 ))
CONF
}
