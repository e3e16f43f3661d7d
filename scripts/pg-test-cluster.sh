#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL cluster on 127.0.0.1.
#
# Usage: scripts/pg-test-cluster.sh -- CMD [ARGS...]
#
# Starts a private cluster in a temporary directory (trust auth, fsync off, a free port,
# listening on 127.0.0.1 only, Unix socket inside the temp dir), creates the databases
# `digest_test` and `dagster_test`, exports
#
#   DIGEST_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:PORT/digest_test
#   DAGSTER_TEST_PG_URL=postgresql+psycopg2://postgres@127.0.0.1:PORT/dagster_test
#   DIGEST_TEST_PG_PORT=PORT
#   DIGEST_ALLOW_NONDURABLE_LEDGER=1
#
# The last one is the unsafe allowance: with fsync and synchronous_commit off, a crash of this
# cluster can lose commits, so `digest run`/`sweep`/`serve` and the Dagster delivery steps refuse
# it without that setting. The crash test that must see every commit survive starts a durable
# cluster of its own (digest_pipeline_tests/integration/test_durable_crash.py).
#
# runs CMD, then stops the cluster and removes the temp dir, and exits with CMD's exit code.
# When run as root (as CI is), initdb/pg_ctl run as the `postgres` user, since initdb refuses
# root. If no PostgreSQL binaries are found, installs Debian's `postgresql` package.
# A detached watchdog stops the cluster even if this script is killed with SIGKILL.
# All of this script's own messages go to stderr; stdout belongs to CMD.
set -euo pipefail

readonly PROG="pg-test-cluster"
SELF="$(readlink -f "${BASH_SOURCE[0]}")"
readonly SELF

# shellcheck source=lib/throwaway-service.sh
source "$(dirname "$SELF")/lib/throwaway-service.sh"

usage() {
    cat >&2 <<'EOF'
Usage: scripts/pg-test-cluster.sh -- CMD [ARGS...]

Starts a throwaway PostgreSQL cluster on 127.0.0.1 (fsync off), exports DIGEST_TEST_DATABASE_URL,
DAGSTER_TEST_PG_URL, DIGEST_TEST_PG_PORT and DIGEST_ALLOW_NONDURABLE_LEDGER=1, runs CMD,
stops the cluster and exits with CMD's exit code.
EOF
}

if [[ "$(id -u)" -eq 0 ]]; then AS_ROOT=1; else AS_ROOT=0; fi
RUNUSER="$(command -v runuser || true)"
for candidate in /usr/sbin/runuser /sbin/runuser; do
    [[ -n "$RUNUSER" ]] && break
    if [[ -x "$candidate" ]]; then RUNUSER="$candidate"; fi
done

# Run a server-side binary (initdb, pg_ctl) as the cluster owner: `postgres` when we are root,
# otherwise the current user. The cd keeps postgres from complaining about an unreadable cwd.
as_owner() {
    local dir="$1"
    shift
    if [[ "$AS_ROOT" -eq 1 ]]; then
        (cd "$dir" && "$RUNUSER" -u postgres -- "$@")
    else
        (cd "$dir" && "$@")
    fi
}

# Stop the cluster in $1 (a temp dir holding data/) if it runs, then remove the dir.
# Used by the EXIT trap and by the watchdog. Never fails.
stop_and_remove() {
    local dir="$1" pg_ctl="$2" pid=""
    [[ -n "$dir" && -d "$dir" ]] || return 0
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        pid="$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)"
        if ! as_owner "$dir" "$pg_ctl" stop -D "$dir/data" -m fast -w -t 30 >/dev/null 2>&1; then
            # pg_ctl could not stop it: immediate shutdown, then kill outright.
            if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
                log "pg_ctl stop failed; sending SIGQUIT to postmaster $pid"
                kill -QUIT "$pid" 2>/dev/null || true
                for _ in 1 2 3 4 5 6 7 8 9 10; do
                    kill -0 "$pid" 2>/dev/null || break
                    sleep 0.5
                done
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

# --- locate the PostgreSQL binaries -----------------------------------------------------------

find_pg_bin() {
    local pg_ctl_path dir
    if command -v initdb >/dev/null && pg_ctl_path="$(command -v pg_ctl)"; then
        # Resolve symlinks (e.g. /usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl) so
        # createdb/psql come from the same installation when it has them.
        dirname "$(readlink -f "$pg_ctl_path")"
        return 0
    fi
    # Debian does not put initdb/pg_ctl on PATH; take the newest major version.
    dir="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    return 1
}

install_postgresql() {
    [[ "$AS_ROOT" -eq 1 ]] || die "PostgreSQL binaries not found and not root; install 'postgresql'"
    command -v apt-get >/dev/null || die "PostgreSQL binaries not found and apt-get is unavailable"
    log "PostgreSQL binaries not found; installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    # Install postgresql-common first and switch off the automatic 'main' cluster, so the
    # package does not start a system-wide server that would outlive this script.
    apt-get install -y --no-install-recommends postgresql-common >&2
    if [[ -f /etc/postgresql-common/createcluster.conf ]]; then
        sed -ri 's/^#?\s*(create_main_cluster)\s*=.*$/\1 = false/' \
            /etc/postgresql-common/createcluster.conf
    fi
    apt-get install -y postgresql >&2
}

if ! PGBIN="$(find_pg_bin)"; then
    install_postgresql
    PGBIN="$(find_pg_bin)" || die "PostgreSQL binaries still not found after installing postgresql"
fi
PG_CTL="$PGBIN/pg_ctl"
INITDB="$PGBIN/initdb"
client() { # createdb/psql: prefer the server's installation, else PATH
    if [[ -x "$PGBIN/$1" ]]; then printf '%s\n' "$PGBIN/$1"; else command -v "$1"; fi
}
CREATEDB="$(client createdb)" || die "createdb not found"
PSQL="$(client psql)" || die "psql not found"
PG_VERSION="$("$PG_CTL" --version | awk '{print $3}')"
# pg_stat_statements, when the installation has it, lets `make bench` count the statements the
# server ran (benchmarks/common.py ServerStatements); the tests do not need it.
SERVER_OPTS="-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
PKGLIB="$(cd "$PGBIN/.." && pwd)/lib"
if [[ -f "$PKGLIB/pg_stat_statements.so" ]]; then
    SERVER_OPTS+=" -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
fi

if [[ "$AS_ROOT" -eq 1 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' user"
    [[ -n "$RUNUSER" ]] || die "running as root but runuser is unavailable"
fi

# --- temp dir, cleanup, watchdog ------------------------------------------------------------

base="${TMPDIR:-/tmp}"
if [[ "$AS_ROOT" -eq 1 ]] && ! "$RUNUSER" -u postgres -- test -x "$base" 2>/dev/null; then
    base=/tmp # the postgres user must be able to reach the cluster dir
fi
PGTMP="$(mktemp -d "$base/digest-pg.XXXXXXXX")"
[[ "$PGTMP" != *[[:space:]]* ]] || die "temp dir path contains whitespace: $PGTMP"
arm_cleanup "$PGTMP" "$PG_CTL"

if [[ "$AS_ROOT" -eq 1 ]]; then
    chown postgres: "$PGTMP"
fi
chmod 700 "$PGTMP"

# it stops the cluster if we die without our trap
start_watchdog

# --- initdb, start --------------------------------------------------------------------------

if ! as_owner "$PGTMP" "$INITDB" -D "$PGTMP/data" -A trust -U postgres --no-sync -E UTF8 \
    --locale=C >"$PGTMP/initdb.log" 2>&1; then
    cat "$PGTMP/initdb.log" >&2
    die "initdb failed"
fi

# Another process may take the port between our probe and the server's bind; retry then.
started=0
for attempt in 1 2 3; do
    PORT="$(free_port)"
    if as_owner "$PGTMP" "$PG_CTL" start -D "$PGTMP/data" -w -t 60 -l "$PGTMP/log" \
        -o "-h 127.0.0.1 -p $PORT -k $PGTMP $SERVER_OPTS" \
        >/dev/null 2>&1; then
        started=1
        break
    fi
    if [[ "$attempt" -lt 3 ]] && grep -q 'Address already in use' "$PGTMP/log" 2>/dev/null; then
        log "port $PORT was taken; retrying"
        continue
    fi
    break
done
if [[ "$started" -ne 1 ]]; then
    log "PostgreSQL failed to start; server log follows"
    cat "$PGTMP/log" >&2 2>/dev/null || true
    die "PostgreSQL failed to start"
fi

for db in digest_test dagster_test; do
    "$CREATEDB" -h 127.0.0.1 -p "$PORT" -U postgres "$db" ||
        die "createdb $db failed"
done
"$PSQL" -h 127.0.0.1 -p "$PORT" -U postgres -d digest_test -Atqc 'select 1' >/dev/null ||
    die "cannot connect to the test cluster"

export DIGEST_TEST_PG_PORT="$PORT"
export DIGEST_TEST_DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/digest_test"
export DAGSTER_TEST_PG_URL="postgresql+psycopg2://postgres@127.0.0.1:$PORT/dagster_test"
# fsync is off for speed, so the ledger on this cluster is a throwaway by declaration
export DIGEST_ALLOW_NONDURABLE_LEDGER=1
log "PostgreSQL $PG_VERSION on 127.0.0.1:$PORT (data in $PGTMP)"

# --- run the command ------------------------------------------------------------------------

set +e
"$@"
rc=$?
set -e
exit "$rc"
