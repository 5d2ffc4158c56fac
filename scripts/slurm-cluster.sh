#!/usr/bin/env bash
# A real two-node SLURM cluster on this one host, for the tests of jobs/ (and for trying
# the job scripts by hand): Debian's slurmctld and two slurmd (virtual nodes c1 and c2)
# with their own munged, all configured, logged and pid-filed under one state directory.
#
#   bash scripts/slurm-cluster.sh install   # Debian packages: slurmctld slurmd slurm-client munge
#   bash scripts/slurm-cluster.sh start     # prints the SLURM_CONF to export
#   bash scripts/slurm-cluster.sh status
#   bash scripts/slurm-cluster.sh stop      # stops exactly the daemons start started
#
# Variables: MPICOLL_SLURM_DIR (state directory, default /tmp/mpicoll-slurm),
# MPICOLL_SLURM_CPUS (CPUs each node declares, default 8), MPICOLL_SLURM_GPUS (GPUs each
# node declares, by count only, default 4), MPICOLL_SLURM_PORT (slurmctld's
# port; the nodes take the next two; default 17000).
#
# Runs as root: slurmd starts jobs as their users. No systemd and no cgroups are needed
# (proctrack/linuxproc, task/none). MpiDefault=pmi2, the PMI the MPICH wheel speaks under
# srun; libpmix is deliberately not installed, as the wheel has no PMIx.
set -euo pipefail

DIR=${MPICOLL_SLURM_DIR:-/tmp/mpicoll-slurm}
CPUS=${MPICOLL_SLURM_CPUS:-8}
GPUS=${MPICOLL_SLURM_GPUS:-4}
PORT=${MPICOLL_SLURM_PORT:-17000}
NODES=(c1 c2)
CONF=$DIR/slurm.conf

die() { echo "slurm-cluster: $*" >&2; exit 1; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null || die "no apt-get: install slurmctld, slurmd, slurm-client and munge by hand"
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        sudo -n true 2>/dev/null || die "installing SLURM needs root or passwordless sudo"
        sudo="sudo -n"
    fi
    echo "slurm-cluster: installing slurmctld slurmd slurm-client munge (Debian) ..." >&2
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
}

# a pid file's process, if it is still alive and one of this cluster's daemons (a stale
# pid file's number may since name another process, never to be signalled)
alive() {
    local pid
    [ -s "$1" ] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null || return 1
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
        munged | slurmctld | slurmd) return 0 ;;
        *) return 1 ;;
    esac
}

write_config() {
    local host
    host=$(hostname -s)
    getent hosts "$host" >/dev/null || die "hostname -s ($host) does not resolve; add it to /etc/hosts (mpiexec inside jobs needs it too)"
    mkdir -p "$DIR"/{state,log,munge} "${NODES[@]/#/$DIR/spool/}"
    chmod 700 "$DIR/munge"
    if [ ! -s "$DIR/munge/munge.key" ]; then  # a key of this cluster's own
        head -c 1024 /dev/urandom > "$DIR/munge/munge.key"
        chmod 400 "$DIR/munge/munge.key"
    fi
    cat > "$CONF" <<EOF
# written by scripts/slurm-cluster.sh: two virtual nodes on $host
ClusterName=mpicoll
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmi2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
EnforcePartLimits=ALL
MinJobAge=4
# schedule a batch job when it is submitted (default: within 3 s, for high submission
# rates), so each test's job starts at once
SchedulerParameters=batch_sched_delay=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
GresTypes=gpu
NodeName=c[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((PORT + 1))-$((PORT + 2))] CPUs=$CPUS RealMemory=2048 Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=c[1-2] Default=YES MaxTime=60 State=UP
EOF
    # stand-in GPUs: character devices like /dev/null (SLURM drops a GPU without a file);
    # enough to check how compare_gpu.sbatch is submitted and how it refuses a node where
    # CuPy finds no GPU
    local i
    mkdir -p "$DIR/dev"
    for ((i = 0; i < GPUS; i++)); do
        [ -e "$DIR/dev/gpu$i" ] || mknod "$DIR/dev/gpu$i" c 1 3 \
            || die "mknod $DIR/dev/gpu$i failed: the stand-in GPUs need CAP_MKNOD (a container without it: run it with that capability)"
    done
    echo "Name=gpu File=$DIR/dev/gpu[0-$((GPUS - 1))]" > "$DIR/gres.conf"
}

# the two nodes up: idle (or, with $1 = busy, running jobs too)
wait_ready() {
    local i up='^idle$'
    [ "${1:-}" = busy ] && up='^(idle|alloc|mix|comp)$'  # (not idle*: not responding)
    for i in $(seq 1 60); do
        if SLURM_CONF=$CONF sinfo -h -N -o "%N %t" 2>/dev/null | awk -v up="$up" '$2 ~ up {n++} END {exit n != 2}'; then
            return 0
        fi
        sleep 0.5
    done
    SLURM_CONF=$CONF sinfo -N >&2 || true
    tail -n 20 "$DIR"/log/*.log >&2 || true
    echo "slurm-cluster: the nodes did not become idle in 30 s (logs above, in $DIR/log)" >&2
    return 1
}

start() {
    [ "$(id -u)" = 0 ] || die "run as root: slurmd starts jobs as their users"
    command -v slurmctld >/dev/null || die "SLURM is not installed: bash scripts/slurm-cluster.sh install"
    if alive "$DIR/slurmctld.pid"; then
        # (its nodes too: a dead slurmd would leave every sbatch --wait pending; slurmctld
        # takes a while to see one dead, so its pid first)
        local node
        for node in "${NODES[@]}"; do
            alive "$DIR/slurmd-$node.pid" \
                || die "a cluster runs in $DIR but its node $node's slurmd does not; bash scripts/slurm-cluster.sh stop, then start"
        done
        wait_ready busy || die "a cluster runs in $DIR but its nodes are not up; bash scripts/slurm-cluster.sh stop, then start"
        echo "slurm-cluster: already running; export SLURM_CONF=$CONF" >&2
        echo "$CONF"
        return 0
    fi
    # a daemon that fails to start (set -e) leaves none of those started before it running
    trap 'stop' ERR
    write_config
    alive "$DIR/munged.pid" || munged --force --socket="$DIR/munge/munge.socket" \
        --key-file="$DIR/munge/munge.key" --pid-file="$DIR/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
    SLURM_CONF=$CONF slurmctld -f "$CONF" -c  # -c: a fresh start, whatever an earlier cluster left here
    local node
    for node in "${NODES[@]}"; do
        SLURM_CONF=$CONF slurmd -f "$CONF" -N "$node"
    done
    trap - ERR
    wait_ready || { stop; exit 1; }  # leave nothing running behind a failed start
    echo "slurm-cluster: nodes ${NODES[*]} up; export SLURM_CONF=$CONF" >&2
    echo "$CONF"
}

stop() {
    # every daemon is told at once (each takes about 2 s to go), then each is waited for
    local pidfile i
    local -a pids=()
    for pidfile in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munged.pid"; do
        [ -e "$pidfile" ] || continue
        if alive "$pidfile"; then
            pids+=("$(cat "$pidfile")")
            kill "${pids[-1]}" 2>/dev/null || true  # (it may have gone since)
        fi
    done
    for pid in ${pids[@]+"${pids[@]}"}; do
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || continue 2; sleep 0.1; done
        # still there after 5 s, and still the daemon (never a process that took its id)
        case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
            munged | slurmctld | slurmd) kill -9 "$pid" 2>/dev/null || true ;;
        esac
    done
    rm -f "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munged.pid"
}

status() {
    local pidfile
    for pidfile in "$DIR/munged.pid" "$DIR/slurmctld.pid" "$DIR"/slurmd-*.pid; do
        if alive "$pidfile"; then echo "$(basename "$pidfile" .pid): running (pid $(cat "$pidfile"))"
        else echo "$(basename "$pidfile" .pid): not running"; fi
    done
    alive "$DIR/slurmctld.pid" && SLURM_CONF=$CONF sinfo -N
}

case "${1:-}" in
    install) install_packages ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 install|start|stop|status" ;;
esac
