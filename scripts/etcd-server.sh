#!/usr/bin/env bash
# A real etcd on this machine for the agent's etcd rendezvous (--rdzv-backend etcd / etcd-v2).
#
#   scripts/etcd-server.sh up       install Debian's etcd-server if missing, start etcd on
#                                   127.0.0.1 unless one answers there, wait until it answers
#   scripts/etcd-server.sh down     stop the etcd this script started (one someone else started
#                                   is left alone)
#   scripts/etcd-server.sh status   exit 0 and print the health answer when etcd answers
#
# Why no systemd: these machines have none (see /work/shared/infra/DOCKER.md), so etcd runs as a
# plain background process, its pid in the state dir. Every command takes one lock (flock), so
# test processes running in parallel may call it at once.
#
# Environment:
#   XRUN_ETCD_STATE   state dir: data dir, pidfile, log (default /var/tmp/xrun-etcd)
#   XRUN_ETCD_PORT    client port (default 2379, etcd's own); the peer port is the next one
set -euo pipefail

STATE=${XRUN_ETCD_STATE:-/var/tmp/xrun-etcd}
PORT=${XRUN_ETCD_PORT:-2379}
PEER_PORT=$((PORT + 1))
URL="http://127.0.0.1:$PORT"

log() { printf '[etcd-server %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

answers() { curl -fsS --max-time 2 "$URL/health" 2>/dev/null | grep -q '"health":"true"'; }

install_etcd() {
    command -v etcd >/dev/null && return 0
    log "installing etcd-server"
    export DEBIAN_FRONTEND=noninteractive
    # Only when the package lists lack it: apt-get update takes a while and needs the network.
    if ! apt-cache show etcd-server >/dev/null 2>&1; then
        apt-get update -qq
    fi
    apt-get install -y -qq etcd-server >/dev/null
}

up() {
    if answers; then
        return 0
    fi
    install_etcd
    mkdir -p "$STATE"
    log "starting etcd on $URL (data in $STATE/data, log $STATE/etcd.log)"
    # setsid: the server outlives the shell (and the pytest run) that started it.
    setsid etcd \
        --name xrun \
        --data-dir "$STATE/data" \
        --listen-client-urls "$URL" \
        --advertise-client-urls "$URL" \
        --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-cluster "xrun=http://127.0.0.1:$PEER_PORT" \
        >>"$STATE/etcd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$STATE/etcd.pid"
    for _ in $(seq 1 300); do
        if answers; then
            log "etcd answers on $URL"
            return 0
        fi
        if ! kill -0 "$(cat "$STATE/etcd.pid")" 2>/dev/null; then
            log "etcd exited at start; the end of $STATE/etcd.log:"
            tail -n 20 "$STATE/etcd.log" >&2
            return 1
        fi
        sleep 0.1
    done
    log "etcd did not answer on $URL within 30s; see $STATE/etcd.log"
    return 1
}

down() {
    local pid
    pid=$(cat "$STATE/etcd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        log "stopping etcd (pid $pid)"
        kill "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$STATE/etcd.pid"
}

status() {
    curl -fsS --max-time 2 "$URL/health"
    echo
}

mkdir -p "$STATE"
exec 9>"$STATE/.lock"
flock 9
case "${1:-}" in
up) up ;;
down) down ;;
status) status ;;
*)
    echo "usage: scripts/etcd-server.sh up|down|status" >&2
    exit 2
    ;;
esac
