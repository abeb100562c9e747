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
#   bash tests/multinode/run.sh [--venv DIR] [--rate 1gbit] [--algos ssgd,admm,ibt,bmuf]
# --algos: afterwards, each algorithm's time per pass (honest: summary.json
# pass_s) on the 3 nodes at this rate, and the bytes that crossed the links.
# Where namespaces cannot be made (not root, no CAP_SYS_ADMIN) it says so,
# prints "0 passed, 0 failed, 1 skipped" and exits 0.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$ROOT/.venv}
RATE=1gbit
ALGOS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --algos) ALGOS=$2; shift 2 ;;
        *) echo "usage: $0 [--venv DIR] [--rate 1gbit] [--algos a,b]" >&2; exit 2 ;;
    esac
done
PY=$VENV/bin/python
MPIEXEC=$VENV/bin/mpiexec
NODES=3
NET=169.254.100
BR=ibtbr$$
TAG=ibt$$                     # namespaces ibt<pid>n<i>, veths ibt<pid>v<i>
WORK=$(mktemp -d /tmp/ibtmpi-multinode.XXXXXX)
pass=0; fail=0

say() { echo "multinode: $*"; }
ok() { say "ok: $*"; pass=$((pass + 1)); }
bad() { say "FAIL: $*"; fail=$((fail + 1)); }

cleanup() {
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
    if [ "$hosts" = "node1 node2 node3" ]; then ok "ibt on 3 nodes: ranks on $hosts"
    else bad "ranks were on '$hosts', not node1 node2 node3"; fi
    # 2 passes x 6 blocks, each an Allreduce of the packed buffer (P floats)
    # into and out of every node: far more than the start-up's messages
    need=$("$PY" -c "import json; s=json.load(open('nodes/summary.json')); print(s['allreduce_bytes'])")
    if [ "$bytes" -ge "$need" ]; then ok "the blocks' data crossed the links ($bytes >= $need bytes)"
    else bad "only $bytes bytes crossed the links; the run's Allreduces sent $need"; fi
else
    bad "the 3-node run failed:"; tail -20 nodes.log
fi
if timeout 300 "$MPIEXEC" -n $NODES "$PY" -m ibtmpi train "${SETS[@]}" \
        --set run.dir="$WORK/local" > local.log 2>&1; then
    if "$PY" - <<'PY'
import numpy as np, sys
a = np.load("nodes/model.npz")["z"]
b = np.load("local/model.npz")["z"]
sys.exit(0 if a.tobytes() == b.tobytes() else 1)
PY
    then ok "z of the 3-node run equals the one-node run bit for bit"
    else bad "z differs between the 3-node and the one-node run"; fi
else
    bad "the one-node run failed:"; tail -20 local.log
fi
for algo in ${ALGOS//,/ }; do
    before=$(across)
    if timeout 900 "$MPIEXEC" -iface "$BR" -launcher ssh -launcher-exec "$WORK/launch" \
            -hosts "$HOSTS" -ppn 1 -n $NODES -genv UCX_TLS tcp,self \
            -genv UCX_NET_DEVICES eth0 "$PY" -m ibtmpi train "${SETS[@]}" \
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
    else
        bad "$algo on 3 nodes failed:"; tail -5 "cmp-$algo.log"
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
