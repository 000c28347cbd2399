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
#   * gVisor: runsc is installed (apt) and registered as the OCI runtime "runsc" (with --network=none) in
#     $AGENTRL_DOCKER_CONFIG (default /etc/docker/daemon.json, the file a dockerd started without
#     --config-file reads; other keys are kept). A project dockerd started here reads it; an already
#     running project dockerd (our pidfile) that lacks the runtime is sent SIGHUP, which reloads
#     `runtimes` without touching running containers. Another engine is never signalled: the script says
#     what to do. AGENTRL_GVISOR=0 skips all of this; AGENTRL_GVISOR=required fails when runsc cannot be
#     registered (CI).
# Only the `export DOCKER_HOST=...` line goes to stdout; progress goes to stderr.
set -euo pipefail

ROOT="${AGENTRL_DOCKER_ROOT:-/var/lib/agentrl-docker}"
SOCK="${AGENTRL_DOCKER_SOCK:-/run/agentrl-docker.sock}"
PIDFILE="$ROOT/dockerd.pid"
LOG="$ROOT/dockerd.log"
WAIT_S="${AGENTRL_DOCKER_WAIT_S:-60}"
GVISOR="${AGENTRL_GVISOR:-1}"
DAEMON_JSON="${AGENTRL_DOCKER_CONFIG:-/etc/docker/daemon.json}"
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

gvisor_fail() {
    if [ "$GVISOR" = "required" ]; then say "gVisor: $*"; exit 1; fi
    say "gVisor (optional): $*"
}

# Install runsc and write its runtime entry into $DAEMON_JSON (idempotent; other keys kept).
register_runsc() {
    [ "$GVISOR" = "0" ] && return 0
    apt_install runsc:runsc || { gvisor_fail "runsc could not be installed"; return 0; }
    local runsc
    runsc="$(command -v runsc)"
    sudo_ mkdir -p "$(dirname "$DAEMON_JSON")"
    sudo_ python3 - "$DAEMON_JSON" "$runsc" <<'PY' >&2 || gvisor_fail "could not write $DAEMON_JSON"
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
cfg = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
entry = {"path": runsc, "runtimeArgs": ["--network=none"]}
if cfg.get("runtimes", {}).get("runsc") == entry:
    sys.exit(0)
cfg.setdefault("runtimes", {})["runsc"] = entry
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
os.replace(tmp, path)
print(f"provision: registered runsc ({runsc}) in {path}")
PY
}

has_runsc() {  # $1: DOCKER_HOST value ("" = the CLI's default)
    local rt
    if [ -n "$1" ]; then
        rt="$(DOCKER_HOST="$1" timeout 15 docker info --format '{{json .Runtimes}}' 2>/dev/null || true)"
    else
        rt="$(env -u DOCKER_HOST timeout 15 docker info --format '{{json .Runtimes}}' 2>/dev/null || true)"
    fi
    case "$rt" in *'"runsc"'*) return 0 ;; *) return 1 ;; esac
}

our_pid() {  # the live project dockerd's pid, or nothing
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then
        echo "$pid"
    fi
}

# Make the engine at $1 offer runsc: reload our own dockerd (SIGHUP), never another one.
ensure_runsc() {
    [ "$GVISOR" = "0" ] && return 0
    command -v runsc >/dev/null 2>&1 || return 0  # already reported by register_runsc
    if has_runsc "$1"; then
        say "gVisor: runtime runsc available"
        return 0
    fi
    local pid
    pid="$(our_pid)"
    if [ "$1" = "$OWN_HOST" ] && [ -n "$pid" ]; then
        say "gVisor: reloading our dockerd (pid $pid, SIGHUP) to add runsc"
        sudo_ kill -HUP "$pid"
        for _ in $(seq 1 20); do has_runsc "$1" && { say "gVisor: runtime runsc available"; return 0; }; sleep 0.5; done
        gvisor_fail "dockerd did not load runsc from $DAEMON_JSON (see $LOG)"
    else
        gvisor_fail "the engine at ${1:-the default socket} is not ours: add runsc to its daemon.json (see $DAEMON_JSON) and reload it (SIGHUP)"
    fi
}

register_runsc

# 1. An engine that already works: use it, start nothing.
if [ -n "${DOCKER_HOST:-}" ] && engine_ok "$DOCKER_HOST"; then
    say "engine reachable at $DOCKER_HOST"
    ensure_runsc "$DOCKER_HOST"
    echo "export DOCKER_HOST=$DOCKER_HOST"
    exit 0
fi
if engine_ok ""; then
    say "engine reachable at the default socket"
    ensure_runsc ""
    echo "unset DOCKER_HOST"
    exit 0
fi
if [ -S "$SOCK" ] && engine_ok "$OWN_HOST"; then
    say "project engine already running at $OWN_HOST"
    ensure_runsc "$OWN_HOST"
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
    cfg_args=()
    [ -f "$DAEMON_JSON" ] && cfg_args=(--config-file "$DAEMON_JSON")
    sudo_ setsid dockerd --host "$OWN_HOST" --data-root "$ROOT/data" --exec-root "$ROOT/exec" \
        --pidfile "$PIDFILE" --storage-driver overlay2 "${cfg_args[@]}" >>"$LOG" 2>&1 </dev/null &
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
ensure_runsc "$OWN_HOST"
echo "export DOCKER_HOST=$OWN_HOST"
