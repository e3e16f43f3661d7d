"""The benchmarks' mailer: accepts every message after a set latency and counts what it sent.

Apart from the Dagster resource that vends it (`bench_defs`), so a delivery helper process
(`runtime.helpers`) makes its own without importing Dagster.
"""

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.ports import Mailer


class BenchMailer(Mailer):
    """Accepts every message after `latency_ms`; counts sends per key and can log them to a file."""

    def __init__(self, latency_ms: float = 0.0, keys_file: Path | None = None) -> None:
        self._latency = latency_ms / 1000
        self._lock = threading.Lock()
        self.sends: Counter[str] = Counter()
        self._keys = keys_file.open("a", encoding="utf-8") if keys_file else None
        self._keys_dir = keys_file.parent if keys_file else None

    @property
    def capabilities(self) -> MailerCapabilities:
        # with no latency it is a local call; with one, it stands for a provider's round trip
        return MailerCapabilities(
            idempotency_window=None, can_lookup=False, remote=self._latency > 0
        )

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if self._latency:
            time.sleep(self._latency)
        with self._lock:
            self.sends[idempotency_key] += 1
            if self._keys is not None:
                # one line per send, flushed at once, so a count survives the step process
                self._keys.write(idempotency_key + "\n")
                self._keys.flush()
        return SendOutcome.sent(f"bench-{idempotency_key}")

    def close(self) -> None:
        with self._lock:
            if self._keys is not None:
                self._keys.close()
                self._keys = None

    def recipe(self) -> Callable[[], Mailer] | None:
        # a helper process's sends are counted only in a file of its own, beside this one's
        if self._keys_dir is None:
            return None
        return partial(_helper_mailer, self._latency * 1000, self._keys_dir)


def _helper_mailer(latency_ms: float, keys_dir: Path) -> BenchMailer:
    """`BenchMailer.recipe`'s call: a helper's mailer, logging its keys to a file of its own."""
    return BenchMailer(latency_ms, keys_dir / f"keys-{os.getpid()}-helper.txt")
