#!/usr/bin/env bash
# A real Docker Engine on this machine for xrun's docker scheduler and its tests.
#
#   scripts/docker-engine.sh up    [--lease PID]  install docker.io if missing, start dockerd if no
#                                                 engine answers (does nothing when one does)
#   scripts/docker-engine.sh image [--lease PID]  `up`, then build the python3 base image unless
#                                                 it exists; prints the image name last
#   scripts/docker-engine.sh down  [--lease PID]  stop the dockerd this script started; with
#                                                 --lease, drop that lease and stop only when no
#                                                 other live lease holder is left and the engine
#                                                 was started for a lease holder (an engine
#                                                 started by a plain `up` stays up)
#   scripts/docker-engine.sh status               say whether an engine answers, and whose it is
#
# Why leases: pytest-xdist runs one session fixture per worker; the first worker may start the
# engine and finish first, and must not stop it under the others. A lease is a file named after
# the holder's pid; a dead holder's lease is ignored.
#
# Why no systemd / no pull: these machines have neither (see /work/shared/infra/DOCKER.md), so the
# engine runs as a plain background process and the base image is built from Debian packages
# (mmdebstrap) and `docker import`ed. The root filesystem tarball is cached between runs.
#
# Environment:
#   XRUN_DOCKER_STATE   state dir: data-root, pidfile, log, leases (default /var/tmp/xrun-docker)
#   XRUN_DOCKER_CACHE   tarball cache (default /var/cache/xrun)
#   XRUN_DOCKER_IMAGE   base image name (default xrun-python:latest)
#   DOCKER_HOST         only unix:// sockets are managed here (default unix:///var/run/docker.sock)
# Every step is serialised with flock, so concurrent callers are safe.
set -euo pipefail

STATE=${XRUN_DOCKER_STATE:-/var/tmp/xrun-docker}
CACHE=${XRUN_DOCKER_CACHE:-/var/cache/xrun}
IMAGE=${XRUN_DOCKER_IMAGE:-xrun-python:latest}
HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}
SUITE=bookworm

case "$HOST" in
unix://*) SOCK=${HOST#unix://} ;;
*)
    echo "docker-engine.sh: DOCKER_HOST=$HOST is not a unix:// socket; this script only manages a local engine (unset DOCKER_HOST)" >&2
    exit 2
    ;;
esac

log() { printf '[docker-engine %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

now_ms() { date +%s%3N; }

# Ask the engine, not the pidfile: an engine someone else started counts too.
engine_answers() {
    [ -S "$SOCK" ] && curl -fsS --max-time 2 --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1
}

# kill -0 succeeds on a zombie, and a dockerd killed with -9 can linger as one until PID 1 reaps
# it, so look at the process state as well.
pid_alive() {
    local pid=$1 st
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    st=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$st" != "Z" ] && [ "$st" != "X" ]
}

our_pid() { cat "$STATE/dockerd.pid" 2>/dev/null || true; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v curl >/dev/null || missing+=(curl)
    [ ${#missing[@]} -eq 0 ] && return 0
    local t0
    t0=$(now_ms)
    log "installing ${missing[*]} (apt-get, --no-install-recommends)"
    # Other engineers may run apt at the same time: wait for dpkg's lock instead of failing.
    local apt=(apt-get -q -o DPkg::Lock::Timeout=300)
    # `update` takes the lists lock, which not every apt version waits for: retry a little.
    local try
    for try in 1 2 3 4 5; do
        "${apt[@]}" update >&2 && break
        [ "$try" = 5 ] && return 1
        log "apt-get update failed (another apt running?); retrying in 5 s"
        sleep 5
    done
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >&2
    log "install took $(($(now_ms) - t0)) ms"
}

# Start dockerd with one set of extra flags; 0 when /_ping answers, 1 when it died or hung.
start_dockerd() {
    local extra=("$@") pid i
    mkdir -p "$STATE/data" "$(dirname "$SOCK")"
    # setsid: the engine must outlive this script and not get the caller's Ctrl-C; 9>&-: it must
    # not inherit our flock, or every later caller would wait on it forever.
    setsid dockerd \
        --host "$HOST" \
        --data-root "$STATE/data" \
        --pidfile "$STATE/dockerd.pid" \
        --exec-opt native.cgroupdriver=cgroupfs \
        "${extra[@]}" \
        </dev/null >>"$STATE/dockerd.log" 2>&1 9>&- &
    pid=$!
    for i in $(seq 1 300); do
        if engine_answers; then
            echo "$pid" >"$STATE/started-by-script"
            # Started for a lease holder (the test fixture): the last holder stops it. Started
            # by hand: it stays up until a plain `down`.
            if [ -n "${LEASE:-}" ]; then : >"$STATE/started-for-leases"; else rm -f "$STATE/started-for-leases"; fi
            return 0
        fi
        pid_alive "$pid" || break
        sleep 0.1
    done
    pid_alive "$pid" && kill -9 "$pid" 2>/dev/null || true
    rm -f "$STATE/dockerd.pid"
    return 1
}

cmd_up() {
    engine_answers && return 0
    install_packages
    local pid t0
    pid=$(our_pid)
    if pid_alive "$pid"; then
        # Ours, alive, not answering yet (another caller just started it, or it is stuck).
        for _ in $(seq 1 100); do engine_answers && return 0; sleep 0.1; done
        log "dockerd pid $pid does not answer on $SOCK; killing it and starting afresh"
        kill -9 "$pid" || true
    fi
    rm -f "$STATE/dockerd.pid"
    t0=$(now_ms)
    # Defaults first (overlay2, iptables); the fallbacks are for machines that refuse them.
    local attempt
    for attempt in "" "--iptables=false" "--storage-driver=vfs --iptables=false"; do
        # shellcheck disable=SC2086  # attempt is a list of flags on purpose
        if start_dockerd $attempt; then
            log "dockerd ${attempt:-(default options)} ready on $SOCK in $(($(now_ms) - t0)) ms (log: $STATE/dockerd.log)"
            return 0
        fi
        log "dockerd ${attempt:-(default options)} did not come up; see $STATE/dockerd.log"
    done
    log "could not start dockerd; last lines of $STATE/dockerd.log:"
    tail -n 20 "$STATE/dockerd.log" >&2
    exit 1
}

image_exists() {
    curl -fsS --max-time 10 --unix-socket "$SOCK" "http://localhost/images/$IMAGE/json" >/dev/null 2>&1
}

# py-spy (a dependency of xrun in pyproject.toml, same pin) for `xrun stacks` and the stall watchdog inside
# containers: a static binary, added as a layer on top of the image (labelled with its version),
# so an image built before keeps everything it had.
PYSPY_VERSION=0.4.2

image_has_pyspy() {
    curl -fsS --max-time 10 --unix-socket "$SOCK" "http://localhost/images/$IMAGE/json" 2>/dev/null |
        grep -q "\"xrun.py-spy\":\"$PYSPY_VERSION\""
}

add_pyspy() {
    local tmp bin t0
    t0=$(now_ms)
    tmp=$(mktemp -d)
    bin="$(dirname "$0")/../.venv/bin/py-spy"
    if [ -x "$bin" ] && "$bin" --version | grep -qx "py-spy $PYSPY_VERSION"; then
        cp "$bin" "$tmp/py-spy"
    else
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "py-spy==$PYSPY_VERSION" >&2
        python3 -c 'import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/py_spy-*.whl")[0]); n = next(n for n in z.namelist() if n.endswith("/scripts/py-spy")); open(sys.argv[1] + "/py-spy", "wb").write(z.read(n))' "$tmp"
        chmod +x "$tmp/py-spy"
    fi
    printf 'FROM %s\nCOPY py-spy /usr/local/bin/py-spy\nLABEL xrun.py-spy=%s\n' "$IMAGE" "$PYSPY_VERSION" >"$tmp/Dockerfile"
    DOCKER_BUILDKIT=0 docker -H "$HOST" build -q -t "$IMAGE" "$tmp" >&2
    rm -rf "$tmp"
    log "added py-spy $PYSPY_VERSION to $IMAGE in $(($(now_ms) - t0)) ms"
}

cmd_image() {
    cmd_up
    if image_exists; then
        image_has_pyspy || add_pyspy
        echo "$IMAGE"
        return 0
    fi
    local tarball="$CACHE/$SUITE-python3-minbase.tar" t0
    mkdir -p "$CACHE"
    if [ ! -s "$tarball" ]; then
        t0=$(now_ms)
        log "building the $SUITE root filesystem with mmdebstrap (cached as $tarball)"
        local tmp
        tmp=$(mktemp -d /dev/shm/xrun-mmdebstrap.XXXXXX)
        # TMPDIR on tmpfs and unsafe-io: dpkg's fsyncs dominate the build time otherwise.
        # The customize hook copies the host's CA bundle: HTTPS from here goes through a proxy
        # with its own CA, and a job that fetches something should trust the same roots.
        if ! TMPDIR=$tmp mmdebstrap --variant=minbase --include=python3,ca-certificates \
            --dpkgopt=force-unsafe-io \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            --customize-hook='cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"' \
            --format=tar "$SUITE" "$tmp/rootfs.tar" >&2; then
            rm -rf "$tmp"
            log "mmdebstrap failed"
            exit 1
        fi
        mv "$tmp/rootfs.tar" "$tarball.part"
        mv "$tarball.part" "$tarball"
        rm -rf "$tmp"
        log "root filesystem built in $(($(now_ms) - t0)) ms"
    fi
    t0=$(now_ms)
    # docker import gives no CMD/ENV; set what a python3 job expects.
    docker -H "$HOST" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PYTHONUNBUFFERED=1' \
        --change 'CMD ["python3"]' \
        "$tarball" "$IMAGE" >&2
    log "imported $IMAGE in $(($(now_ms) - t0)) ms"
    add_pyspy
    echo "$IMAGE"
}

take_lease() {
    [ -n "${LEASE:-}" ] || return 0
    mkdir -p "$STATE/leases"
    : >"$STATE/leases/$LEASE"
}

live_leases() {
    local f n=0
    for f in "$STATE"/leases/*; do
        [ -e "$f" ] || continue
        if pid_alive "$(basename "$f")"; then n=$((n + 1)); else rm -f "$f"; fi
    done
    echo "$n"
}

cmd_down() {
    if [ -n "${LEASE:-}" ]; then
        rm -f "$STATE/leases/$LEASE"
        if [ "$(live_leases)" -gt 0 ]; then
            log "other lease holders remain; leaving the engine running"
            return 0
        fi
        if [ ! -e "$STATE/started-for-leases" ]; then
            return 0 # started by hand (or by someone else): not ours to stop
        fi
    fi
    local pid
    pid=$(our_pid)
    if [ ! -e "$STATE/started-by-script" ] || ! pid_alive "$pid"; then
        rm -f "$STATE/started-by-script"
        engine_answers && log "the engine on $SOCK was not started by this script; leaving it alone"
        return 0
    fi
    # Its own containerd (a child) exits after it; wait for that too, so that `down` returning
    # means no process of the engine is left.
    local children
    children=$(pgrep -P "$pid" 2>/dev/null || true)
    kill -TERM "$pid"
    # dockerd stops its containers first (up to its shutdown timeout, 15 s by default).
    for _ in $(seq 1 300); do pid_alive "$pid" || break; sleep 0.1; done
    if pid_alive "$pid"; then
        log "dockerd pid $pid ignored SIGTERM for 30 s; killing it"
        kill -9 "$pid" || true
    fi
    local child
    for child in $children; do
        for _ in $(seq 1 100); do pid_alive "$child" || break; sleep 0.1; done
    done
    rm -f "$STATE/started-by-script" "$STATE/started-for-leases" "$STATE/dockerd.pid"
    log "dockerd stopped"
}

cmd_status() {
    if engine_answers; then
        if [ -e "$STATE/started-by-script" ]; then
            echo "up (started by this script, pid $(our_pid), live leases: $(live_leases))"
        else
            echo "up (not started by this script)"
        fi
    else
        echo "down"
        return 1
    fi
}

action=${1:-}
shift || true
LEASE=
while [ $# -gt 0 ]; do
    case "$1" in
    --lease) LEASE=${2:?--lease needs a pid}; shift 2 ;;
    *) echo "docker-engine.sh: unknown option '$1' (expected --lease PID)" >&2; exit 2 ;;
    esac
done

mkdir -p "$STATE"
exec 9>"$STATE/lock"
flock 9
case "$action" in
up) take_lease; cmd_up ;;
image) take_lease; cmd_image ;;
down) cmd_down ;;
status) cmd_status ;;
*)
    echo "usage: docker-engine.sh up|image|down|status [--lease PID]  (got '${action}')" >&2
    exit 2
    ;;
esac
