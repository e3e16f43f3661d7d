"""The chaos run's worker processes: starting, SIGKILLing and restarting them, and their logs.

Its own module because process management (argv, descriptors, reaping, the JSON pass records a
kill may cut short) is apart from the experiment's schedule and its verdict, which only drive it.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from digest_pipeline.domain.periods import Period
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline.rigs.chaos import worker
from digest_pipeline.rigs.chaos.settings import API_KEY, ChaosSettings


@dataclass
class Incarnation:
    """One worker process: its slot, generation, logs and fate."""

    index: int
    generation: int
    process: "subprocess.Popen[bytes]"
    stdout: Path
    stderr: Path
    killed: bool = False

    @property
    def name(self) -> str:
        return f"w{self.index}-{self.generation} (pid {self.process.pid})"


class Fleet:
    """Starts, kills and restarts the worker processes; never leaves one running."""

    def __init__(
        self,
        settings: ChaosSettings,
        *,
        database_url: str,
        provider_url: str,
        period: Period,
        log_dir: Path,
        deadline: float,
    ) -> None:
        self._settings = settings
        self._provider_url = provider_url
        self._period = period
        self._log_dir = log_dir
        self._deadline = deadline
        self._env = {
            **os.environ,
            worker.DATABASE_URL_VARIABLE: database_url,
            worker.PROVIDER_KEY_VARIABLE: API_KEY,
        }
        self.incarnations: list[Incarnation] = []
        self.current: dict[int, Incarnation] = {}

    def start(self, index: int) -> Incarnation:
        s = self._settings
        generation = sum(1 for i in self.incarnations if i.index == index)
        remaining = max(self._deadline - time.monotonic(), 1.0)
        argv = [
            sys.executable,
            "-m",
            "digest_pipeline.rigs.chaos.worker",
            f"--index={index}",
            f"--period={self._period}",
            f"--provider-url={self._provider_url}",
            f"--seed={s.seed * 1000 + index * 100 + generation}",
            f"--lease-seconds={s.lease_seconds}",
            f"--retry-base-seconds={s.retry_base_seconds}",
            f"--retry-cap-seconds={s.retry_cap_seconds}",
            f"--max-attempts={s.max_attempts}",
            f"--batch-size={s.batch_size}",
            f"--concurrency={s.concurrency}",
            f"--pass-items={s.pass_items}",
            f"--deadline-seconds={remaining:.1f}",
        ]
        out = self._log_dir / f"w{index}-{generation}.out"
        err = self._log_dir / f"w{index}-{generation}.err"
        # the child holds its own copies of the descriptors; ours close right away
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                argv,
                cwd=PROJECT_ROOT,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        incarnation = Incarnation(index, generation, process, out, err)
        self.incarnations.append(incarnation)
        self.current[index] = incarnation
        return incarnation

    def running(self) -> list[Incarnation]:
        return [i for i in self.current.values() if i.process.poll() is None]

    def kill(self, incarnation: Incarnation) -> None:
        with contextlib.suppress(ProcessLookupError):
            incarnation.process.send_signal(signal.SIGKILL)
        incarnation.process.wait()
        incarnation.killed = True

    def crashed(self) -> list[Incarnation]:
        """Workers that exited on their own with a non-zero status."""
        return [
            i
            for i in self.incarnations
            if not i.killed and i.process.poll() is not None and i.process.returncode != 0
        ]

    def all_exited(self) -> bool:
        return all(i.process.poll() is not None for i in self.current.values())

    def stop_all(self) -> None:
        """SIGKILLs whatever still runs and reaps every process (the `finally` of a run)."""
        for incarnation in self.incarnations:
            if incarnation.process.poll() is None:
                self.kill(incarnation)
            else:
                incarnation.process.wait()

    def records(self) -> Iterator[dict[str, Any]]:
        """Every pass record the workers printed (a kill may cut the last line short)."""
        for incarnation in self.incarnations:
            for line in incarnation.stdout.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        yield record

    def logs(self, *, max_workers: int = 8, tail: int = 15) -> str:
        """Exit statuses, and the stderr tails of the workers that wrote any."""
        parts = [f"worker logs in {self._log_dir}:"]
        for i in self.incarnations:
            code = i.process.poll()
            fate = "SIGKILLed" if i.killed else "running" if code is None else f"exit {code}"
            parts.append(f"  {i.name}: {fate}; {i.stdout.name}, {i.stderr.name}")
        noisy = [i for i in self.incarnations if i.stderr.exists() and i.stderr.stat().st_size]
        for i in noisy[-max_workers:]:
            lines = i.stderr.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {i.name} stderr (last {len(lines)} lines) ---")
            parts.extend(lines)
        return "\n".join(parts)
