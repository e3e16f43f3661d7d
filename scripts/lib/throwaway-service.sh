# Sourced by the scripts that run a command against a throwaway server (pg-test-cluster.sh,
# redis-test-server.sh) and by debian-test-tools.sh: their messages, a free loopback port, and
# the cleanup that stops the server and removes its temp dir however the script ends.
# The sourcing script sets PROG and SELF first and, for the cleanup, defines
# `stop_and_remove DIR [ARG...]`, which must never fail.

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# A TCP port on 127.0.0.1 nothing listens on right now (another process may still take it).
free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# The watchdog's own mode, when the script is started as `SELF --_watchdog PARENT ARG...`:
# waits for the parent script to die, then runs `stop_and_remove ARG...` and exits.
run_watchdog_mode_if_asked() {
    [[ "${1:-}" == "--_watchdog" ]] || return 0
    local parent="$2"
    shift 2
    while kill -0 "$parent" 2>/dev/null; do sleep 1; done
    stop_and_remove "$@"
    exit 0
}

CLEANUP_ARGS=()
WATCHDOG_PID=""

# shellcheck disable=SC2317  # invoked through the EXIT trap
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    if [[ -n "$WATCHDOG_PID" ]]; then
        kill -- "-$WATCHDOG_PID" 2>/dev/null || kill "$WATCHDOG_PID" 2>/dev/null
    fi
    stop_and_remove "${CLEANUP_ARGS[@]}"
    exit "$rc"
}

# From now on, however the script ends (exit, SIGINT, SIGTERM), `stop_and_remove ARG...` runs.
arm_cleanup() {
    CLEANUP_ARGS=("$@")
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# A watchdog in its own session with no inherited stdio, so neither a signal to our process
# group nor a closed pipe reaches it: it runs the cleanup if this script dies without its trap
# (SIGKILL).
start_watchdog() {
    setsid "$SELF" --_watchdog "$$" "${CLEANUP_ARGS[@]}" </dev/null >/dev/null 2>&1 &
    WATCHDOG_PID=$!
}
