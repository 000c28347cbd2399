#!/usr/bin/env bash
# Provision a Docker engine for agentrl's sandboxed tools (idempotent; for CI and developers).
#
#   eval "$(sandbox/provision.sh)"      # exports DOCKER_HOST when a project-owned engine is used
#
# Behaviour:
#   * If a working engine is already reachable (the current DOCKER_HOST, or the default socket),
#     nothing is started; the script prints `export DOCKER_HOST=...` for that engine (if set).
#   * Otherwise it installs docker.io (apt) when dockerd is missing, and starts a project-owned
#     dockerd with data under $AGENTRL_DOCKER_ROOT (default /var/lib/agentrl-docker), socket
#     $AGENTRL_DOCKER_SOCK (default /run/agentrl-docker.sock), pidfile $AGENTRL_DOCKER_ROOT/dockerd.pid,
#     log $AGENTRL_DOCKER_ROOT/dockerd.log. If that pidfile names a live dockerd, it is reused;
#     if it names a dead process, the daemon is restarted. Nothing is ever killed by name.
#   * debootstrap is installed as well (needed to build the sandbox image offline).
# Only the `export DOCKER_HOST=...` line goes to stdout; progress goes to stderr.
set -euo pipefail

ROOT="${AGENTRL_DOCKER_ROOT:-/var/lib/agentrl-docker}"
SOCK="${AGENTRL_DOCKER_SOCK:-/run/agentrl-docker.sock}"
PIDFILE="$ROOT/dockerd.pid"
LOG="$ROOT/dockerd.log"
WAIT_S="${AGENTRL_DOCKER_WAIT_S:-60}"
OWN_HOST="unix://$SOCK"

say() { echo "provision: $*" >&2; }

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

engine_ok() {  # $1: DOCKER_HOST value ("" = the CLI's default)
    if [ -n "$1" ]; then
        DOCKER_HOST="$1" timeout 15 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
    else
        env -u DOCKER_HOST timeout 15 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
    fi
}

APT_UPDATED=0
apt_install() {  # install missing apt packages: $@ = "command:package" pairs
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null || { say "cannot install ${missing[*]}: no apt-get"; return 1; }
    if [ "$APT_UPDATED" -eq 0 ]; then
        say "apt-get update"
        sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        APT_UPDATED=1
    fi
    say "installing ${missing[*]}"
    sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# debootstrap is needed by the offline image recipe, whichever engine is used.
apt_install debootstrap:debootstrap

# 1. An engine that already works: use it, start nothing.
if [ -n "${DOCKER_HOST:-}" ] && engine_ok "$DOCKER_HOST"; then
    say "engine reachable at $DOCKER_HOST"
    echo "export DOCKER_HOST=$DOCKER_HOST"
    exit 0
fi
if engine_ok ""; then
    say "engine reachable at the default socket"
    echo "unset DOCKER_HOST"
    exit 0
fi
if [ -S "$SOCK" ] && engine_ok "$OWN_HOST"; then
    say "project engine already running at $OWN_HOST"
    echo "export DOCKER_HOST=$OWN_HOST"
    exit 0
fi

# 2. Start the project-owned dockerd.
apt_install dockerd:docker.io docker:docker.io
sudo_ mkdir -p "$ROOT/data" "$ROOT/exec"

if [ -f "$PIDFILE" ]; then
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then
        say "our dockerd (pid $pid) is alive but not answering yet; waiting"
    else
        say "stale pidfile (pid ${pid:-?} is dead): restarting dockerd"
        sudo_ rm -f "$PIDFILE" "$SOCK"
        pid=""
        # The dead daemon's own containerd (pidfile under OUR exec root) may still be shutting down; a new
        # dockerd would wait on it and time out. Wait for it; if it lingers, stop that pid (ours) only.
        cpidfile="$ROOT/exec/containerd/containerd.pid"
        cpid="$(cat "$cpidfile" 2>/dev/null || true)"
        if [ -n "$cpid" ] && grep -q "$ROOT" "/proc/$cpid/cmdline" 2>/dev/null; then
            for _ in $(seq 1 40); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.5; done
            if kill -0 "$cpid" 2>/dev/null && grep -q "$ROOT" "/proc/$cpid/cmdline" 2>/dev/null; then
                say "stopping the dead daemon's containerd (pid $cpid)"
                sudo_ kill -TERM "$cpid" || true
                for _ in $(seq 1 20); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.5; done
            fi
        fi
        sudo_ rm -f "$cpidfile"
    fi
else
    pid=""
fi

if [ -z "$pid" ]; then
    [ -S "$SOCK" ] && sudo_ rm -f "$SOCK"   # a socket left by a dead daemon
    say "starting dockerd (data $ROOT/data, socket $SOCK, log $LOG)"
    # setsid: the daemon must outlive this script and the CI step's process group.
    sudo_ setsid dockerd --host "$OWN_HOST" --data-root "$ROOT/data" --exec-root "$ROOT/exec" \
        --pidfile "$PIDFILE" --storage-driver overlay2 >>"$LOG" 2>&1 </dev/null &
    disown || true
fi

deadline=$((SECONDS + WAIT_S))
until [ -S "$SOCK" ] && engine_ok "$OWN_HOST"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "dockerd did not answer within ${WAIT_S}s; last log lines:"
        tail -n 30 "$LOG" >&2 || true
        exit 1
    fi
    sleep 0.5
done
say "dockerd ready (pid $(cat "$PIDFILE" 2>/dev/null || echo '?')) at $OWN_HOST"
echo "export DOCKER_HOST=$OWN_HOST"
