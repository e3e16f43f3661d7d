"""The real `digest serve` console script as a subprocess on a free loopback port, for tests.

It starts `digest serve --port 0` with the given `DIGEST_*` environment (and the test cluster's
`DIGEST_ALLOW_NONDURABLE_LEDGER`, if set), reads the one line the command prints when it
listens (so no waiting and no polling), and stops it with SIGINT, as a terminal's Ctrl-C would;
`stopped()` returns its exit code and everything it wrote on stderr.
"""

import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline.rigs.servers.pg_cluster import throwaway_allowance

DIGEST = Path(sys.executable).with_name("digest")
_LISTENING = re.compile(r"listening on (http://\S+)")


class ServeProcess:
    """`digest serve` on 127.0.0.1 in a child process; use it as a context manager."""

    def __init__(self, env: Mapping[str, str], *, start_timeout: float = 60.0) -> None:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("DIGEST_")}
        self._env = {**inherited, **throwaway_allowance(), **env}
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._first_line = ""
        self.url = ""

    def __enter__(self) -> "ServeProcess":
        self._proc = subprocess.Popen(
            [str(DIGEST), "serve", "--host", "127.0.0.1", "--port", "0"],
            cwd=PROJECT_ROOT,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stderr is not None
        # the command prints this line once the socket listens (or its refusal, and exits)
        self._first_line = self._proc.stderr.readline()
        found = _LISTENING.search(self._first_line)
        if found is None:
            code, rest = self.stopped()
            raise RuntimeError(f"digest serve did not start (exit {code}): {rest.strip()}")
        self.url = found.group(1)
        return self

    def stopped(self, timeout: float = 30.0) -> tuple[int, str]:
        """Sends SIGINT (if still running), waits, and returns (exit code, all of stderr)."""
        assert self._proc is not None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        try:
            _, err = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            _, err = self._proc.communicate()
        return self._proc.returncode, self._first_line + (err or "")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self.stopped()
