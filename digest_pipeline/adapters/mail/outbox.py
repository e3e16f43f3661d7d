"""The embedded default mailer: each digest becomes one RFC 5322 file in a Maildir.

The file is named by operation key and created with a hard link from `tmp/` into `new/`, which
fails if the name exists, so two writers of one key (or a retry) can never leave two files. A
key can always be looked up, so reconciliation of an outbox `unknown` never needs an operator.
"""

import errno
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from email.parser import BytesHeaderParser
from functools import partial
from pathlib import Path

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    LookupResult,
    LookupStatus,
    MailerCapabilities,
    Message,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports import Mailer

#: the outbox never forgets a key; a finite stand-in keeps date arithmetic safe
FOREVER = timedelta(days=3650)


def file_name(key: OperationKey) -> str:
    """`digest_2026-W42_customer-1842.eml`: Maildir names may not hold ':' (the info separator)."""
    return f"{key}".replace(":", "_") + ".eml"


class OutboxMailer(Mailer):
    """A Maildir at `directory` (`DIGEST_OUTBOX_DIR`); folders are created on first use."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._counter = 0
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(idempotency_window=FOREVER, can_lookup=True, remote=False)

    def recipe(self) -> Callable[[], Mailer]:
        return partial(OutboxMailer, self._dir)

    @property
    def directory(self) -> Path:
        return self._dir

    def _delivered(self, name: str) -> Path | None:
        for folder in ("new", "cur"):
            path = self._dir / folder / name
            if path.exists():
                return path
        return None

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if idempotency_key != str(message.key):
            raise ValueError("the idempotency key must be the message's operation key")
        name = file_name(message.key)
        message_id = dict(message.headers).get("Message-ID", idempotency_key)
        if self._delivered(name) is not None:
            return SendOutcome.sent(message_id, duplicate=True)
        try:
            data = to_bytes(message)
        except RenderError:
            return SendOutcome.failed(FailureClass.PERMANENT, "render_error")
        try:
            return self._write(name, data, message_id)
        except OSError as e:
            # Nothing reached new/ (the link is the delivery), so trying again later is safe.
            code = errno.errorcode.get(e.errno or 0, "oserror")
            return SendOutcome.failed(FailureClass.TRANSIENT, f"outbox:{code}")

    def _write(self, name: str, data: bytes, message_id: str) -> SendOutcome:
        for folder in ("tmp", "new", "cur"):
            (self._dir / folder).mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._counter += 1
            unique = f"{os.getpid()}.{threading.get_ident()}.{self._counter}"
        tmp = self._dir / "tmp" / f"{unique}.{name}"
        try:
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self._dir / "new" / name)
            except FileExistsError:
                return SendOutcome.sent(message_id, duplicate=True)
        finally:
            tmp.unlink(missing_ok=True)
        return SendOutcome.sent(message_id)

    def lookup(self, idempotency_key: str) -> LookupResult:
        path = self._delivered(file_name(OperationKey.parse(idempotency_key)))
        if path is None:
            return LookupResult(LookupStatus.NOT_FOUND)
        with path.open("rb") as f:
            headers = BytesHeaderParser().parse(f)
        return LookupResult(LookupStatus.FOUND, headers.get("Message-ID"))

    def stored(self) -> list[Path]:
        """Every delivered file (new/ and cur/), for tests and the simulator."""
        return sorted(
            p
            for folder in ("new", "cur")
            if (self._dir / folder).is_dir()
            for p in (self._dir / folder).iterdir()
        )
