#!/usr/bin/env bash
# Run a command against a throwaway Redis server on 127.0.0.1.
#
# Usage: scripts/redis-test-server.sh -- CMD [ARGS...]
#
# Starts a private redis-server in a temporary directory (a free port, listening on 127.0.0.1
# only, protected mode on, no Unix socket, no persistence: no RDB snapshots, no AOF), exports
#
#   DIGEST_TEST_REDIS_URL=redis://127.0.0.1:PORT/0
#   DIGEST_TEST_REDIS_PORT=PORT
#
# runs CMD, then stops the server and removes the temp dir, and exits with CMD's exit code.
# If redis-server is not found and we are root, installs Debian's `redis-server` package
# without letting it start (or leave running) its system-wide service on port 6379.
# A detached watchdog stops the server even if this script is killed with SIGKILL.
# All of this script's own messages go to stderr; stdout belongs to CMD.
set -euo pipefail

readonly PROG="redis-test-server"
SELF="$(readlink -f "${BASH_SOURCE[0]}")"
readonly SELF

# shellcheck source=lib/throwaway-service.sh
source "$(dirname "$SELF")/lib/throwaway-service.sh"

usage() {
    cat >&2 <<'EOF'
Usage: scripts/redis-test-server.sh -- CMD [ARGS...]

Starts a throwaway Redis server on 127.0.0.1, exports DIGEST_TEST_REDIS_URL and
DIGEST_TEST_REDIS_PORT, runs CMD, stops the server and exits with CMD's exit code.
EOF
}

if [[ "$(id -u)" -eq 0 ]]; then AS_ROOT=1; else AS_ROOT=0; fi

# True if $1 is a live (not zombie) redis process. Guards the kills below against a pid that
# was reused after our server died on its own.
is_redis_pid() {
    local pid="$1" comm="" state=""
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r "/proc/$pid/stat" ]]; then
        state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)"
        [[ "$state" != "Z" ]] || return 1
        comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
        [[ "$comm" == redis* ]] || return 1
    fi
    return 0
}

# Stop the server whose pid is in $1/server.pid if it runs (SIGTERM, a bounded wait, then
# SIGKILL), then remove the dir. Used by the EXIT trap and by the watchdog. Never fails.
stop_and_remove() {
    local dir="$1" pid=""
    [[ -n "$dir" && -d "$dir" ]] || return 0
    if [[ -f "$dir/server.pid" ]]; then
        pid="$(head -n 1 "$dir/server.pid" 2>/dev/null || true)"
        if is_redis_pid "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do # up to 10 s
                is_redis_pid "$pid" || break
                sleep 0.2
            done
            if is_redis_pid "$pid"; then
                log "redis-server $pid ignored SIGTERM; sending SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
    fi
    rm -rf -- "$dir"
}

# Internal mode: the detached watchdog (lib/throwaway-service.sh).
run_watchdog_mode_if_asked "$@"

case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
    --) shift ;;
esac
if [[ $# -eq 0 ]]; then
    usage
    exit 2
fi

# --- locate (or install) redis-server -------------------------------------------------------

find_redis_server() {
    local candidate
    if candidate="$(command -v redis-server)"; then
        printf '%s\n' "$candidate"
        return 0
    fi
    for candidate in /usr/bin/redis-server /usr/sbin/redis-server; do
        if [[ -x "$candidate" ]]; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 1
}

# shellcheck source=lib/apt-without-services.sh
source "$(dirname "$SELF")/lib/apt-without-services.sh"

install_redis() {
    [[ "$AS_ROOT" -eq 1 ]] ||
        die "redis-server not found (PATH, /usr/bin, /usr/sbin) and not root;" \
            "install Debian's 'redis-server' package"
    command -v apt-get >/dev/null || die "redis-server not found and apt-get is unavailable"
    log "redis-server not found; installing Debian's redis-server package"
    # The package's postinst starts a system-wide server on port 6379 that would outlive this
    # script; the install starts no service.
    apt_install_without_services redis-server
    # Belt and braces: if the service started anyway (e.g. a policy the init system ignores),
    # stop it.
    if command -v service >/dev/null; then
        service redis-server stop >/dev/null 2>&1 || true
    fi
    local pidfile pid
    for pidfile in /run/redis/redis-server.pid /var/run/redis/redis-server.pid; do
        [[ -f "$pidfile" ]] || continue
        pid="$(head -n 1 "$pidfile" 2>/dev/null || true)"
        if is_redis_pid "$pid"; then
            log "stopping the system redis-server ($pid) the package started"
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
}

# The traps the main part uses are set here already, so that an interrupted install still
# restores policy-rc.d (exit runs the EXIT trap).
trap 'exit 130' INT
trap 'exit 143' TERM

if ! REDIS_SERVER="$(find_redis_server)"; then
    install_redis
    REDIS_SERVER="$(find_redis_server)" ||
        die "redis-server still not found after installing redis-server"
fi
REDIS_CLI=""
if ! REDIS_CLI="$(command -v redis-cli)"; then
    REDIS_CLI=""
    for candidate in "$(dirname "$REDIS_SERVER")/redis-cli" /usr/bin/redis-cli; do
        if [[ -x "$candidate" ]]; then
            REDIS_CLI="$candidate"
            break
        fi
    done
fi
if [[ -z "$REDIS_CLI" ]]; then
    command -v python3 >/dev/null ||
        die "neither redis-cli nor python3 found (needed to probe the server)"
fi
REDIS_VERSION="$("$REDIS_SERVER" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"

# --- temp dir, cleanup, watchdog ------------------------------------------------------------

RTMP="$(mktemp -d "${TMPDIR:-/tmp}/digest-redis.XXXXXXXX")"
[[ "$RTMP" != *[[:space:]]* ]] || die "temp dir path contains whitespace: $RTMP"
arm_cleanup "$RTMP"

chmod 700 "$RTMP"

# it stops the server if we die without our trap
start_watchdog

# --- start, wait until it answers -----------------------------------------------------------

# Probe the server on 127.0.0.1:$1: if it answers PING with PONG, print the process_id its
# INFO reports (so a foreign server that grabbed the port is not mistaken for ours).
probe_redis() {
    local port="$1" reply
    if [[ -n "$REDIS_CLI" ]]; then
        reply="$("$REDIS_CLI" -h 127.0.0.1 -p "$port" ping 2>/dev/null)" || return 1
        [[ "$reply" == "PONG" ]] || return 1
        "$REDIS_CLI" -h 127.0.0.1 -p "$port" info server 2>/dev/null |
            tr -d '\r' | sed -n 's/^process_id://p'
    else
        python3 - "$port" <<'EOF' 2>/dev/null
import socket
import sys


def command(sock, *args):
    sock.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
        if data.startswith(b"$"):  # bulk string: $LEN\r\nBODY\r\n
            head, _, body = data.partition(b"\r\n")
            if len(body) >= int(head[1:]) + 2:
                return body[: int(head[1:])]
        elif data.endswith(b"\r\n"):
            return data


with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
    if command(s, b"PING") != b"+PONG\r\n":
        sys.exit(1)
    for line in command(s, b"INFO", b"server").decode().splitlines():
        if line.startswith("process_id:"):
            print(line.partition(":")[2])
EOF
    fi
}

show_logs() {
    local f
    for f in "$RTMP/redis.log" "$RTMP/redis.out"; do
        [[ -s "$f" ]] && cat "$f" >&2
    done
    return 0
}

# Another process may take the port between our probe and the server's bind; retry then.
status=""
for attempt in 1 2 3; do
    PORT="$(free_port)"
    : >"$RTMP/redis.log"
    # No config file: everything is on the command line. Without a `unixsocket` setting
    # redis-server opens no Unix socket.
    "$REDIS_SERVER" \
        --bind 127.0.0.1 --port "$PORT" --dir "$RTMP" \
        --save '' --appendonly no --daemonize no --protected-mode yes \
        --logfile "$RTMP/redis.log" \
        </dev/null >"$RTMP/redis.out" 2>&1 &
    SERVER_PID=$!
    printf '%s\n' "$SERVER_PID" >"$RTMP/server.pid"
    status="timeout"
    for _ in $(seq 1 300); do # up to 30 s
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            status="exited"
            break
        fi
        # A PONG from some other server that holds the port does not count: ours will
        # fail to bind and exit, and we retry on another port.
        if [[ "$(probe_redis "$PORT" || true)" == "$SERVER_PID" ]]; then
            status="up"
            break
        fi
        sleep 0.1
    done
    [[ "$status" == "exited" ]] || break
    if [[ "$attempt" -lt 3 ]] &&
        grep -q 'Address already in use' "$RTMP/redis.log" "$RTMP/redis.out" 2>/dev/null; then
        log "port $PORT was taken; retrying"
        continue
    fi
    break
done
case "$status" in
    up) ;;
    timeout)
        log "redis-server did not answer PING on 127.0.0.1:$PORT within 30 s; log follows"
        show_logs
        die "redis-server failed to start"
        ;;
    *)
        log "redis-server exited during startup; log follows"
        show_logs
        die "redis-server failed to start"
        ;;
esac

export DIGEST_TEST_REDIS_PORT="$PORT"
export DIGEST_TEST_REDIS_URL="redis://127.0.0.1:$PORT/0"
log "Redis ${REDIS_VERSION:-?} on 127.0.0.1:$PORT (dir $RTMP)"

# --- run the command ------------------------------------------------------------------------

set +e
"$@"
rc=$?
set -e
exit "$rc"
