#!/usr/bin/env bash
# A real four-node Slurm cluster on this one machine, for xrun's Slurm tests and demos.
#
#   scripts/slurm-cluster.sh up             install what is missing, start munged, slurmctld and
#                                           slurmd c1..c4, wait until every node answers; on a
#                                           running cluster whose config differs from the one
#                                           this script writes, apply the new one (running jobs
#                                           survive: `scontrol reconfigure`, or a slurmctld
#                                           restart that keeps its saved state)
#   scripts/slurm-cluster.sh down           stop the daemons this script started, undo /etc/hosts
#   scripts/slurm-cluster.sh install        only install the packages (slurm, munge, shellcheck)
#   scripts/slurm-cluster.sh status         exit 0 and print `sinfo` when the cluster answers
#   scripts/slurm-cluster.sh acquire PID    `up`, and record PID as a user of the cluster
#   scripts/slurm-cluster.sh release PID    forget PID; `down` once no live user is left, but only
#                                           if `acquire` started the cluster (a cluster brought up
#                                           by hand, or with XRUN_SLURM_KEEP=1, stays up)
#
# Every command takes one lock (flock), so test processes running in parallel may call it at once.
# State (config, spool, logs, pid files) lives in $XRUN_SLURM_STATE (default /var/tmp/xrun-slurm).
# Clients find the config through /etc/slurm/slurm.conf, a symlink to the state dir's copy, so
# sbatch/squeue work from any shell; if that path holds someone else's file, export SLURM_CONF.
# Needs root (apt-get, /etc/hosts, daemons). No slurmdbd: jobs' end records go to jobcomp/filetxt.
#
# Partitions: `debug` (the default; never preempted), `low` (preemptible: REQUEUE, GraceTime=60)
# and `high` (a higher PriorityTier: its jobs preempt `low`'s), all over every node.
# XRUN_SLURM_PREEMPT_SIGNAL=1 at `up` adds SlurmctldParameters=preempt_send_user_signal (a job's
# --signal warning is sent at preemption too); `up` without it takes it away again.
set -euo pipefail

STATE=${XRUN_SLURM_STATE:-/var/tmp/xrun-slurm}
NODES=(c1 c2 c3 c4)
CPUS_PER_NODE=4
NODE_PORT_BASE=${XRUN_SLURM_NODE_PORT_BASE:-17000}
CTLD_PORT=${XRUN_SLURM_CTLD_PORT:-6817}
CONF="$STATE/slurm.conf"
HOSTS_MARK="# xrun-slurm-cluster"
export SLURM_CONF="$CONF"

log() { echo "slurm-cluster: $*" >&2; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    command -v shellcheck >/dev/null || missing+=(shellcheck)
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    local t0=$SECONDS
    # `update` only when the package lists are absent: on a machine that has them it costs ~10 s.
    if ! apt-cache show slurmctld >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    log "installed in $((SECONDS - t0)) s"
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    munge_ok && return 0
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key /etc/munge
    chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    # munged refuses to run as root without --force; run it as its own user.
    runuser -u munge -- /usr/sbin/munged 9>&-
    touch "$STATE/started-munged"
    for _ in $(seq 50); do munge_ok && return 0; sleep 0.1; done
    log "munged did not start; see /var/log/munge/munged.log"
    return 1
}

conf_text() {
    {
        cat <<EOF
# Written by scripts/slurm-cluster.sh; \`up\` applies it to a running cluster when it differs.
ClusterName=xrun
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# No cgroups in this container: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Heterogeneous jobs are started only by backfill; its default 30 s interval makes them crawl.
SchedulerParameters=bf_interval=1
# The nodes advertise more CPUs than this host has.
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible in squeue/scontrol for an hour (xrun falls back when they are gone).
MinJobAge=3600
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# \`sacct -c\` reads this file when there is no slurmdbd.
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
KillWait=5
# Preemption by partition: a job in \`high\` requeues one in \`low\` after low's GraceTime (its
# tasks get SIGTERM at once, the batch shell only when the grace has run out).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
EOF
        if [ "${XRUN_SLURM_PREEMPT_SIGNAL:-0}" = 1 ]; then
            echo "SlurmctldParameters=preempt_send_user_signal"
        fi
        local i=1
        for n in "${NODES[@]}"; do
            echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((NODE_PORT_BASE + i)) CPUs=$CPUS_PER_NODE RealMemory=2048 State=UNKNOWN"
            i=$((i + 1))
        done
        # debug: the suite's ordinary jobs; PreemptMode=OFF, so no job ever preempts them.
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF"
        echo "PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=60"
        echo "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
    }
}

write_conf() {
    mkdir -p "$STATE/ctld" "$STATE/d" "$STATE/run" "$STATE/log"
    conf_text >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
    mkdir -p /etc/slurm
    if [ -L /etc/slurm/slurm.conf ] || [ ! -e /etc/slurm/slurm.conf ]; then
        ln -sfn "$CONF" /etc/slurm/slurm.conf
    else
        log "/etc/slurm/slurm.conf is not ours; clients need: export SLURM_CONF=$CONF"
    fi
}

# /etc/hosts may be a bind mount: rewrite it in place, never replace the file.
hosts_add() {
    grep -q "$HOSTS_MARK" /etc/hosts && return 0
    echo "127.0.0.1 ${NODES[*]} $HOSTS_MARK" >>/etc/hosts
}
hosts_remove() {
    grep -q "$HOSTS_MARK" /etc/hosts || return 0
    local kept
    kept=$(grep -v "$HOSTS_MARK" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
}

cluster_answers() { timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; }

# Ready: every node answers (idle, or busy with jobs of parallel test processes).
nodes_ready() {
    local states
    states=$(sinfo -h -N -o '%t' 2>/dev/null | sort -u) || return 1
    [ -n "$states" ] && ! grep -qvxE 'idle|alloc|mix|comp' <<<"$states"
}

wait_ready() {
    local deadline=$((SECONDS + 60))
    while [ $SECONDS -lt $deadline ]; do
        nodes_ready && return 0
        sleep 0.1
    done
    log "nodes not ready after 60 s: $(sinfo -h -N -o '%N=%t' | tr '\n' ' '); logs in $STATE/log"
    return 1
}

do_up() {
    install_packages
    mkdir -p "$STATE"
    if cluster_answers && wait_ready; then
        conf_text | cmp -s - "$CONF" || apply_conf
        return 0
    fi
    local t0=$EPOCHREALTIME
    start_munge
    write_conf
    hosts_add
    # -c: start clean, do not resurrect jobs from an earlier run's saved state.
    slurmctld -c -f "$CONF" 9>&-
    for n in "${NODES[@]}"; do
        slurmd -N "$n" -f "$CONF" 9>&-
    done
    touch "$STATE/started"
    wait_ready
    log "up in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b - a}') s"
}

# The running cluster gets this script's config without losing a job: `scontrol reconfigure`
# takes new partitions and SlurmctldParameters; a PreemptType change needs a slurmctld restart,
# which without -c recovers every job from StateSaveLocation (slurmd keeps running the steps).
apply_conf() {
    local want have pid
    write_conf
    log "config changed: scontrol reconfigure"
    scontrol reconfigure
    want=$(awk -F= '$1 == "PreemptType" {print $2}' "$CONF")
    # Not `scontrol ... | grep -q`: grep's early exit fails the pipe (pipefail).
    have=$(scontrol show config | awk '$1 == "PreemptType" {print $3}')
    if [ "$have" != "$want" ]; then
        log "PreemptType needs a slurmctld restart (jobs are kept)"
        pid=$(cat "$STATE/run/slurmctld.pid")
        kill "$pid"
        for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
        slurmctld -f "$CONF" 9>&-
        for _ in $(seq 100); do cluster_answers && break; sleep 0.1; done
    fi
    wait_ready
}

# A zombie counts as gone: in some containers nothing reaps daemons that exit.
alive() { [ -r "/proc/$1/stat" ] && ! awk '{exit ($3 == "Z") ? 0 : 1}' "/proc/$1/stat"; }

kill_pidfile() {
    local f=$1 pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

do_down() {
    [ -d "$STATE" ] || { hosts_remove; return 0; }
    cluster_answers && { scancel --quiet --user=root 2>/dev/null || true; }
    for n in "${NODES[@]}"; do kill_pidfile "$STATE/run/slurmd-$n.pid"; done
    kill_pidfile "$STATE/run/slurmctld.pid"
    if [ -e "$STATE/started-munged" ]; then
        kill_pidfile /run/munge/munged.pid
        rm -f "$STATE/started-munged"
    fi
    hosts_remove
    [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ] &&
        rm -f /etc/slurm/slurm.conf
    rm -f "$STATE/started" "$STATE/acquired" "$STATE/holders"
}

do_status() {
    if cluster_answers; then
        sinfo
        return 0
    fi
    echo "slurm-cluster: down (state dir $STATE)"
    return 1
}

do_acquire() {
    local holder=$1
    mkdir -p "$STATE"
    if ! cluster_answers; then
        do_up
        touch "$STATE/acquired"
    else
        wait_ready
    fi
    echo "$holder" >>"$STATE/holders"
}

do_release() {
    local holder=$1 live="" p
    [ -f "$STATE/holders" ] || return 0
    while read -r p; do
        [ -n "$p" ] && [ "$p" != "$holder" ] && kill -0 "$p" 2>/dev/null && live+="$p"$'\n'
    done <"$STATE/holders"
    printf '%s' "$live" >"$STATE/holders"
    if [ -z "$live" ] && [ -e "$STATE/acquired" ] && [ "${XRUN_SLURM_KEEP:-0}" != 1 ]; then
        do_down
    fi
}

main() {
    local cmd=${1:-}
    case "$cmd" in
    up | down | status | acquire | release | install) ;;
    *)
        echo "usage: $0 up|down|status|install|acquire PID|release PID" >&2
        exit 2
        ;;
    esac
    if [ "$cmd" = status ]; then
        do_status
        return
    fi
    [ "$(id -u)" = 0 ] || { log "needs root (apt-get, /etc/hosts, daemons)"; exit 2; }
    mkdir -p "$(dirname "$STATE")"
    exec 9>"$STATE.lock"
    flock 9
    case "$cmd" in
    up) do_up ;;
    install) install_packages ;;
    down) do_down ;;
    acquire) do_acquire "${2:?acquire needs the holder PID}" ;;
    release) do_release "${2:?release needs the holder PID}" ;;
    esac
}

main "$@"
