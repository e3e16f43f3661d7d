"""A private PostgreSQL cluster that keeps its commits, for tests that crash the database itself.

scripts/pg-test-cluster.sh runs the suite's cluster with `fsync` and `synchronous_commit` off,
where an immediate stop loses commits the ledger was told of; a crash test run there would blame
the ledger for the database's loss. This cluster runs with both on, in a temporary folder, on a
free loopback port that survives a restart. It finds the binaries as the script does and, as
root, runs them as the `postgres` user (initdb refuses root). `throwaway_allowance` passes the
suite's cluster's unsafe allowance on to the processes rigs start.
"""

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from digest_pipeline.domain.durability import ALLOW_VARIABLE
from digest_pipeline.rigs.servers.loopback import free_port as _free_port

#: a durable primary: every commit's WAL is flushed before the commit returns
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
OWNER = "postgres"
START_TIMEOUT_SECONDS = 60


def find_binaries() -> Path | None:
    """The folder of `initdb` and `pg_ctl`: on PATH (resolved), else Debian's newest version."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(pg_ctl).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")],
    )
    for folder in reversed(versions):
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def throwaway_allowance() -> dict[str, str]:
    """`DIGEST_ALLOW_NONDURABLE_LEDGER` as scripts/pg-test-cluster.sh exported it, or {}.

    A rig or test that builds a process's environment without the caller's `DIGEST_*` settings
    passes this on, so its commands may deliver on the suite's cluster (fsync off).
    """
    value = os.environ.get(ALLOW_VARIABLE)
    return {} if value is None else {ALLOW_VARIABLE: value}


def _runuser() -> str:
    """util-linux's `runuser`, which root's PATH may lack (it lives in /usr/sbin)."""
    return shutil.which("runuser") or "/usr/sbin/runuser"


class PgCluster:
    """`initdb`, then `start`/`stop` as often as a test likes; `close` stops it and removes it all.

    Args:
        binaries: the folder of `initdb` and `pg_ctl` (`find_binaries()`).
        settings: server settings passed with `-c` on every start.
    """

    def __init__(self, binaries: Path, settings: dict[str, str] | None = None) -> None:
        self._bin = binaries
        self._settings = {**DURABLE, **(settings or {})}
        self._as_root = os.geteuid() == 0
        self.folder = Path(tempfile.mkdtemp(prefix="digest-pg-durable-", dir=self._base()))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.port = _free_port()
        try:
            if self._as_root:
                owner = pwd.getpwnam(OWNER)
                os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", OWNER, "--no-sync")
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the cluster's `postgres` database (psycopg 3)."""
        return f"postgresql+psycopg://{OWNER}@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Starts the server and waits until it accepts connections (after any crash recovery)."""
        options = " ".join(f"-c {k}={v}" for k, v in self._settings.items())
        self._run(
            "pg_ctl",
            *("start", "-D", str(self.data), "-w", "-t", str(START_TIMEOUT_SECONDS)),
            *("-l", str(self.log)),
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.folder} {options}",
        )

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m MODE`; `immediate` is a crash: no checkpoint, recovery on start."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w")

    def running(self) -> bool:
        """Whether a postmaster runs on the data folder (`pg_ctl status`)."""
        status = self._command("pg_ctl", "status", "-D", str(self.data))
        return (
            subprocess.run(status, check=False, capture_output=True, cwd=self.folder).returncode
            == 0
        )

    def close(self) -> None:
        """Stops the server (immediately: its data is thrown away) and removes the folder."""
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "PgCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def server_log(self, lines: int = 30) -> str:
        """The last `lines` of the server's log, for a failure's message."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no server log)"

    def _base(self) -> str:
        """A temporary folder the `postgres` user can reach (when we run as root)."""
        base = tempfile.gettempdir()
        if not self._as_root:
            return base
        probe = [_runuser(), "-u", OWNER, "--", "test", "-x", base]
        return (
            base
            if subprocess.run(probe, check=False, capture_output=True).returncode == 0
            else "/tmp"
        )

    def _command(self, tool: str, *args: str) -> Sequence[str]:
        argv = [str(self._bin / tool), *args]
        return [_runuser(), "-u", OWNER, "--", *argv] if self._as_root else argv

    def _run(self, tool: str, *args: str) -> None:
        # the cwd keeps postgres from complaining about a working folder it cannot read
        done = subprocess.run(
            self._command(tool, *args), check=False, capture_output=True, text=True, cwd=self.folder
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {args[0] if args else ''} failed ({done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}\n{self.server_log()}"
            )
