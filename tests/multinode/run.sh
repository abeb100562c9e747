#!/usr/bin/env bash
# A simulated cluster on one machine: each node is a Linux network namespace
# with its own UTS namespace (its own hostname: MPI sees separate hosts),
# joined by a veth pair to a bridge in the root namespace, its link capped
# with tc tbf, addresses from 169.254.100.0/24 on those veths only. An
# `mpiexec -n 3` training runs one rank per node (master on node1, workers
# on node2 and node3), through Hydra's ssh launcher pointed at a script that
# enters the node's namespaces instead of ssh; the block's Allreduce must
# cross the links (the veths' byte counters are printed), and the run's z
# must equal the same run on one node bit for bit.
#
# The namespaces share this machine's memory, so UCX would move the data
# through shared memory as between ranks of one node; UCX_TLS=tcp,self
# makes it use the network, as between real nodes.
#
# Usage (root; everything is torn down at the end, also on failure or
# Ctrl-C, leaving no namespace, link or process behind):
#   bash tests/multinode/run.sh [--venv DIR] [--nodes 3] [--rate 1gbit]
#                               [--algos ssgd,admm,ibt,bmuf] [--data DIR]
#                               [--set SECTION.KEY=VALUE ...] [--keep DIR]
# --nodes: 2 to 8 nodes, one rank each (rank 0, the master, on node1).
# --algos: afterwards, the Allreduce's alpha and beta measured across the
# nodes at this rate (benchmarks/allreduce_alpha_beta.py), then each
# algorithm's time per pass (honest: summary.json pass_s), the bytes that
# crossed the links, and the scaling model's time per pass for the run
# (its own compute and master figures, the measured alpha and beta:
# tests/multinode/predict.py) with the model's error. --data and --set
# (repeatable) change only these comparison runs: another data set and
# settings added after the defaults (benchmarks/time_to_accuracy.py's
# recipe); --keep DIR copies their run directories (DIR/cmp-ALGO) and
# DIR/ab.json out before everything is removed.
# Then Slurm across the same nodes (SLURM_PART=0 skips it; preemption and
# requeue of a job across them included): slurmctld in the
# root namespace, one slurmd per node namespace with its hostname as
# NodeName, munge shared; `sbatch --nodes=N` of slurm/multinode-srun.sbatch
# and slurm/multinode-mpirun.sbatch must put a rank on each node and end
# with the one-node run's z.
# Where namespaces cannot be made (not root, no CAP_SYS_ADMIN) it says so,
# prints "0 passed, 0 failed, 1 skipped" and exits 0.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$ROOT/.venv}
RATE=1gbit
ALGOS=""
NODES=3
CMP_DATA=""
CMP_SETS=()
KEEP=""
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --algos) ALGOS=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --data) CMP_DATA=$(cd "$2" && pwd) || exit 2; shift 2 ;;
        --set) CMP_SETS+=(--set "$2"); shift 2 ;;
        --keep) KEEP=$2; shift 2 ;;
        *) echo "usage: $0 [--venv DIR] [--nodes 3] [--rate 1gbit] [--algos a,b] [--data DIR] [--set K=V] [--keep DIR]" >&2; exit 2 ;;
    esac
done
PY=$VENV/bin/python
MPIEXEC=$VENV/bin/mpiexec
case "$NODES" in [2-8]) ;; *) echo "--nodes must be 2 to 8, got '$NODES'" >&2; exit 2 ;; esac
EXPECT=$(seq -s' ' -f "node%g" 1 "$NODES")    # where the ranks must run
NET=169.254.100
BR=ibtbr$$
TAG=ibt$$                     # namespaces ibt<pid>n<i>, veths ibt<pid>v<i>
WORK=$(mktemp -d /tmp/ibtmpi-multinode.XXXXXX)
pass=0; fail=0

say() { echo "multinode: $*"; }
ok() { say "ok: $*"; pass=$((pass + 1)); }
bad() { say "FAIL: $*"; fail=$((fail + 1)); }

cleanup() {
    if [ -n "${SLURM_CONF:-}" ]; then        # this script's Slurm only
        scontrol shutdown >/dev/null 2>&1
        sleep 1
        [ -s "$WORK/slurmctld.pid" ] && kill -9 "$(cat "$WORK/slurmctld.pid")" 2>/dev/null
        [ "${STARTED_MUNGE:-0}" = 1 ] && munge_stop
    fi
    for i in $(seq 1 $NODES); do
        ns=${TAG}n$i
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
            ip netns del "$ns" 2>/dev/null
        fi
        ip link del "${TAG}v$i" 2>/dev/null
    done
    ip link del "$BR" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$(id -u)" != 0 ] || ! ip netns add "${TAG}probe" 2>/dev/null; then
    say "skipped: network namespaces cannot be made here (needs root)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
ip netns del "${TAG}probe"
[ -x "$MPIEXEC" ] || { say "FAIL: $MPIEXEC missing"; echo "0 passed, 1 failed"; exit 1; }

# -- the cluster ---------------------------------------------------------------
ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"      # mpiexec's side: the proxies call back here
ip link set "$BR" up
for i in $(seq 1 $NODES); do
    ns=${TAG}n$i
    ip netns add "$ns"
    ip link add "${TAG}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${TAG}v$i" master "$BR"
    ip link set "${TAG}v$i" up
    ip netns exec "$ns" ip addr add "$NET.$i/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    # the link's bandwidth, both ways: into the node (the bridge's veth) and out
    tc qdisc add dev "${TAG}v$i" root tbf rate "$RATE" burst 256kb latency 100ms
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 100ms
done
say "$NODES nodes ($NET.1-$NODES on $BR), links capped at $RATE"

# Hydra's ssh launcher calls: LAUNCHER [-x] HOST COMMAND; this one enters the
# node's network namespace and a UTS namespace with the node's hostname
cat > "$WORK/launch" <<EOF
#!/bin/bash
host=""; args=()
for a in "\$@"; do
    if [ -z "\$host" ] && [[ "\$a" == $NET.* ]]; then host="\$a"; continue; fi
    if [ -n "\$host" ]; then args+=("\$a"); fi
done
n=\${host##*.}
exec ip netns exec ${TAG}n\$n unshare --uts sh -c 'hostname "node\$0"; exec sh -c "\$*"' "\$n" "\${args[@]}"
EOF
chmod +x "$WORK/launch"
HOSTS=$(seq -s, -f "$NET.%g" 1 $NODES)
across() {          # bytes through every node link, both ways
    local t=0
    for i in $(seq 1 $NODES); do
        for d in rx tx; do
            t=$((t + $(cat "/sys/class/net/${TAG}v$i/statistics/${d}_bytes")))
        done
    done
    echo "$t"
}

# -- the data and the runs ---------------------------------------------------------
cd "$WORK"
"$PY" -m ibtmpi prep synth data --n 1200 --size 16 --shards 2 --quiet \
    || { bad "prep synth"; echo "$pass passed, $fail failed"; exit 1; }
SETS=(--set data.path="$WORK/data" --set model.layers=reference --set data.split_size=100
      --set data.batch=16 --set run.passes=2 --set run.threads=1 --set run.quiet=true
      --set algorithm.name=ibt)
before=$(across)
t0=$(date +%s.%N)
if timeout 300 "$MPIEXEC" -iface "$BR" -launcher ssh -launcher-exec "$WORK/launch" \
        -hosts "$HOSTS" -ppn 1 -n $NODES -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0 \
        "$PY" -m ibtmpi train "${SETS[@]}" --set run.dir="$WORK/nodes" > nodes.log 2>&1; then
    t1=$(date +%s.%N)
    bytes=$(( $(across) - before ))
    say "bytes across node links: $bytes ($(awk "BEGIN{printf \"%.1f\", $bytes/1048576}") MiB in $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s)"
    hosts=$("$PY" -c "import json; print(' '.join(r['host'] for r in json.load(open('nodes/summary.json'))['environment']['ranks']))")
    if [ "$hosts" = "$EXPECT" ]; then ok "ibt on $NODES nodes: ranks on $hosts"
    else bad "ranks were on '$hosts', not $EXPECT"; fi
    # 2 passes x 6 blocks, each an Allreduce of the packed buffer (P floats)
    # into and out of every node: far more than the start-up's messages
    need=$("$PY" -c "import json; s=json.load(open('nodes/summary.json')); print(s['allreduce_bytes'])")
    if [ "$bytes" -ge "$need" ]; then ok "the blocks' data crossed the links ($bytes >= $need bytes)"
    else bad "only $bytes bytes crossed the links; the run's Allreduces sent $need"; fi
else
    bad "the $NODES-node run failed:"; tail -20 nodes.log
fi
if timeout 300 "$MPIEXEC" -n $NODES "$PY" -m ibtmpi train "${SETS[@]}" \
        --set run.dir="$WORK/local" > local.log 2>&1; then
    if "$PY" - <<'PY'
import numpy as np, sys
a = np.load("nodes/model.npz")["z"]
b = np.load("local/model.npz")["z"]
sys.exit(0 if a.tobytes() == b.tobytes() else 1)
PY
    then ok "z of the $NODES-node run equals the one-node run bit for bit"
    else bad "z differs between the $NODES-node and the one-node run"; fi
else
    bad "the one-node run failed:"; tail -20 local.log
fi
# -- Slurm across the nodes: slurmctld here, one slurmd per node namespace --
slurm_part() {
    . "$ROOT/tests/slurm/munge_slurm.sh"
    slurm_install || { bad "cannot install slurm-wlm"; return; }
    munge_start || { bad "munged does not start"; return; }
    export SLURM_CONF=$WORK/slurm.conf
    mkdir -p "$WORK/state"
    chmod 755 "$WORK"
    cat > "$SLURM_CONF" <<CONF
ClusterName=ibtmn
SlurmctldHost=$(hostname -s)($NET.254)
$(slurm_conf_common "$WORK")
NodeName=node[1-$NODES] NodeAddr=$NET.[1-$NODES] Sockets=1 CoresPerSocket=1 ThreadsPerCore=1 State=UNKNOWN
PartitionName=mn Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -f "$SLURM_CONF"
    for i in $(seq 1 $NODES); do
        mkdir -p "$WORK/spool-node$i"
        # nsenter, not `ip netns exec`: slurmd needs the host's /sys (cgroups)
        nsenter --net="/run/netns/${TAG}n$i" unshare --uts \
            sh -c "hostname node$i; exec slurmd -f '$SLURM_CONF' -N node$i"
    done
    for k in $(seq 1 60); do
        [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" = "idle" ] && break
        sleep 1
    done
    if [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" != "idle" ]; then
        bad "the Slurm nodes did not come up: $(sinfo -h 2>&1 | head -3)"; return
    fi
    say "Slurm up: slurmctld here, slurmd on node1-$NODES"
    printf '[data]\npath = "%s"\nsplit_size = 100\nbatch = 16\n[model]\nlayers = "reference"\n[algorithm]\nname = "ibt"\n[run]\npasses = 2\nthreads = 1\nquiet = true\n' \
        "$WORK/data" > run.toml
    for tpl in multinode-srun multinode-mpirun; do
        local id
        id=$(submit_started "$tpl" "$WORK/$tpl-%j.out" run.toml "$WORK/$tpl")
        job_wait "$id" 300
        hosts=$("$PY" -c "import json; print(' '.join(r['host'] for r in json.load(open('$WORK/$tpl/summary.json'))['environment']['ranks']))" 2>/dev/null)
        same=$("$PY" -c "import numpy as np; print(np.load('$WORK/$tpl/model.npz')['z'].tobytes() == np.load('$WORK/local/model.npz')['z'].tobytes())" 2>/dev/null)
        if [ "$hosts" = "$EXPECT" ] && [ "$same" = True ]; then
            ok "sbatch --nodes=$NODES slurm/$tpl.sbatch: ranks on $hosts, z equal to the one-node run"
        else
            bad "slurm/$tpl.sbatch: ranks on '$hosts', z equal: '$same'"
            tail -15 "$WORK/$tpl-$id.out"
        fi
    done
    preempt_part
}

# Preemption across the nodes, as on the one-node CI cluster: SIGUSR1 to the
# job's steps -> every rank checkpoints, exit 75, the template requeues the
# job, the requeued job resumes on the nodes and ends where an
# uninterrupted run of the same settings ends, bit for bit.
preempt_part() {
    local id out="$WORK/preempt.out" passes=12
    sed -e "s/passes = 2/passes = $passes/" run.toml > long.toml
    "$MPIEXEC" -n $NODES "$PY" -m ibtmpi train --config long.toml \
        --set run.dir="$WORK/straight" > straight.log 2>&1 \
        || { bad "the uninterrupted $passes-pass run failed"; tail -5 straight.log; return; }
    id=$(submit_started multinode-srun "$out" long.toml "$WORK/preempt")
    for k in $(seq 1 120); do
        [ -f "$WORK/preempt/metrics.jsonl" ] && [ "$(wc -l < "$WORK/preempt/metrics.jsonl")" -ge 3 ] && break
        sleep 0.5
    done
    scancel --signal=USR1 "$id"
    for k in $(seq 1 120); do grep -q "requeueing job" "$out" 2>/dev/null && break; sleep 1; done
    job_release "$id"               # Slurm holds a requeued job ~2 minutes: start it now
    job_wait "$id" 300
    same=$("$PY" -c "import numpy as np; print(np.load('$WORK/preempt/model.npz')['z'].tobytes() == np.load('$WORK/straight/model.npz')['z'].tobytes())" 2>/dev/null)
    hosts=$("$PY" -c "import json; print(' '.join(r['host'] for r in json.load(open('$WORK/preempt/summary.json'))['environment']['ranks']))" 2>/dev/null)
    if grep -q "preempted (exit 75): requeueing job $id" "$out" && grep -q "resuming from" "$out" \
            && [ "$same" = True ] && [ "$hosts" = "$EXPECT" ]; then
        ok "preempted across $NODES nodes (SIGUSR1): checkpointed, requeued, resumed on $hosts, z equal to the uninterrupted run"
    else
        bad "preemption across the nodes: requeued/resumed/z equal/hosts: $(grep -c 'requeueing job' "$out")/$(grep -c 'resuming from' "$out")/'$same'/'$hosts'"
        tail -20 "$out"
        scontrol -o show job "$id" 2>&1 | head -c 600; echo
        grep -i "$id\|error" "$WORK/slurmctld.log" | tail -15
    fi
}
[ "${SLURM_PART:-1}" = 1 ] && slurm_part

if [ -n "$ALGOS" ]; then
    # the Allreduce's alpha and beta on these links (the model's inputs)
    if timeout 600 "$MPIEXEC" -iface "$BR" -launcher ssh -launcher-exec "$WORK/launch" \
            -hosts "$HOSTS" -ppn 1 -n $NODES -genv UCX_TLS tcp,self \
            -genv UCX_NET_DEVICES eth0 "$PY" "$ROOT/benchmarks/allreduce_alpha_beta.py" \
            --json "$WORK/ab.json" > ab.log 2>&1; then
        sed "s/^/multinode: $RATE, $NODES nodes: /" ab.log | grep "fit:"
    else
        bad "the alpha/beta measurement failed:"; tail -5 ab.log
    fi
fi
for algo in ${ALGOS//,/ }; do
    before=$(across)
    if timeout 900 "$MPIEXEC" -iface "$BR" -launcher ssh -launcher-exec "$WORK/launch" \
            -hosts "$HOSTS" -ppn 1 -n $NODES -genv UCX_TLS tcp,self \
            -genv UCX_NET_DEVICES eth0 "$PY" -m ibtmpi train "${SETS[@]}" \
            ${CMP_DATA:+--set data.path="$CMP_DATA"} "${CMP_SETS[@]}" \
            --set algorithm.name="$algo" --set run.dir="$WORK/cmp-$algo" > "cmp-$algo.log" 2>&1; then
        bytes=$(( $(across) - before ))
        "$PY" - "$WORK/cmp-$algo" "$algo" "$RATE" "$bytes" <<'PY'
import json, sys
d, algo, rate, nbytes = sys.argv[1:]
s = json.load(open(f"{d}/summary.json"))
per = sum(s["pass_s"]) / s["passes"]
print(f"multinode: {algo} at {rate}: {per:.2f} s per pass (honest), "
      f"{s['allreduce_calls'] / s['passes']:.0f} Allreduce(s) per pass, "
      f"{int(nbytes) / 2**20 / s['passes']:.1f} MiB per pass across the links, "
      f"test accuracy {s['test_acc']:.4f}")
PY
        [ -s "$WORK/ab.json" ] && "$PY" "$HERE/predict.py" "$WORK/cmp-$algo" "$WORK/ab.json" \
            | sed "s/^/multinode: $algo at $RATE: /"
    else
        bad "$algo on $NODES nodes failed:"; tail -5 "cmp-$algo.log"
    fi
    [ -n "$KEEP" ] && [ -d "$WORK/cmp-$algo" ] && mkdir -p "$KEEP" \
        && rm -rf "${KEEP:?}/cmp-$algo" && cp -a "$WORK/cmp-$algo" "$KEEP/"
done
[ -n "$KEEP" ] && [ -s "$WORK/ab.json" ] && cp "$WORK/ab.json" "$KEEP/"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
