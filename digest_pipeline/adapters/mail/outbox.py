"""The embedded default mailer: each digest becomes one RFC 5322 file in a Maildir.

The file is named by operation key and created with a hard link from `tmp/` into `new/`, which
fails if the name exists, so two writers of one key (or a retry) can never leave two files. A
key can always be looked up, so reconciliation of an outbox `unknown` never needs an operator.

Names stay distinct on a case-insensitive file system (macOS, Windows, some network shares):
each upper-case letter of the customer id is written as `+` and the letter in lower case
(`CUSTOMER-0002` is `+c+u+s+t+o+m+e+r-0002`), and customer ids never hold `+`, so two keys
never share a name in any letter case. An all-lower-case id keeps the plain name older outboxes
used, and for any other id the older name is looked at too, so an outbox written before the
escaping is still found. A file counts as the key's delivery only when its
`X-Digest-Operation-Key` header names that key: a file under the name that holds another key
(an older outbox's case collision, or a file put there by hand) is never taken as delivered. A
send that finds such a file fails as `permanent` with detail `outbox:name_holds_other_key`,
since nothing was delivered and no retry can write while the file is there; an operator moves
the file and replays the key. `lookup` reports such a key as not found. Every file written
here names its key: a message without the header gets it, and one naming another key is refused
as `permanent` (`outbox:key_header_mismatch`).
"""

import errno
import os
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from email.message import Message as MimeMessage
from email.parser import BytesHeaderParser
from functools import partial
from pathlib import Path

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass, SendOutcome, render_failure_code
from digest_pipeline.domain.mailer_identity import mailer_identity
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
#: the header that names a stored message's operation key (the composer sets it on every digest)
OPERATION_KEY_HEADER = "X-Digest-Operation-Key"
#: how much of a stored file is read to find its key: the header block, never a whole body, so a
#: stray large file in the Maildir cannot exhaust memory
MAX_HEADER_BYTES = 64 * 1024
#: the detail of a send refused because its file name holds another key's message
NAME_HOLDS_OTHER_KEY = "outbox:name_holds_other_key"
#: the detail of a message whose own key header names another key: its file would vouch for
#: the wrong delivery
KEY_HEADER_MISMATCH = "outbox:key_header_mismatch"
_UPPER = re.compile("[A-Z]")
#: the file beside `new/` holding the outbox's random id, from which its mailer identity comes
OUTBOX_ID_FILE = ".digest-outbox-id"
#: how much of that file is read: an id, never a stray large file
MAX_ID_BYTES = 64


def file_name(key: OperationKey) -> str:
    """`digest_2026-W42_customer-1842.eml`, with `+c` for each upper-case `C` of the customer id.

    Maildir names may not hold ':' (the info separator), hence the underscores. The name starts
    with the key's instance (`vip_digest_2026-W42_…`), so two instances sharing a Maildir never
    share a file. An instance's name is lower-case and the period is always spelled with an
    upper-case `W`, so only the customer id needs the escaping.
    """
    customer = _UPPER.sub(lambda m: "+" + m.group().lower(), key.customer_id)
    return f"{key.instance}_{key.period}_{customer}.eml"


def legacy_file_name(key: OperationKey) -> str:
    """The name before the escaping: the key as typed, which collides by case on some disks."""
    return f"{key}".replace(":", "_") + ".eml"


def stored_headers(path: Path) -> MimeMessage:
    """The header block of a stored file, read no further than `MAX_HEADER_BYTES`.

    Anything but a regular file (a folder, a FIFO that would block) holds no headers. An
    OSError (the file vanished, no permission) propagates.
    """
    if not path.is_file():
        return MimeMessage()
    with path.open("rb") as f:
        head = f.read(MAX_HEADER_BYTES)
    end = head.find(b"\r\n\r\n")
    return BytesHeaderParser().parsebytes(head if end < 0 else head[: end + 4])


def stored_key(path: Path) -> str | None:
    """The operation key a stored file names in its header; None if it names none."""
    return _named_key(stored_headers(path))


def _named_key(headers: MimeMessage) -> str | None:
    value = headers.get(OPERATION_KEY_HEADER)
    return None if value is None else str(value).strip()


def _with_key_header(message: Message) -> Message | None:
    """The message carrying its own key in `OPERATION_KEY_HEADER`; None if it names another."""
    named = [v for n, v in message.headers if n.lower() == OPERATION_KEY_HEADER.lower()]
    if not named:
        return replace(
            message, headers=(*message.headers, (OPERATION_KEY_HEADER, str(message.key)))
        )
    return message if named == [str(message.key)] else None


class OutboxMailer(Mailer):
    """A Maildir at `directory` (`DIGEST_OUTBOX_DIR`); folders are created on first use."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._counter = 0
        self._lock = threading.Lock()
        self._identity: str | None = None

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(idempotency_window=FOREVER, can_lookup=True, remote=False)

    def recipe(self) -> Callable[[], Mailer]:
        return partial(OutboxMailer, self._dir)

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def identity(self) -> str:
        with self._lock:
            if self._identity is None:
                self._identity = mailer_identity("outbox", self._outbox_id())
            return self._identity

    def _outbox_id(self) -> str:
        """The random id in the Maildir's `OUTBOX_ID_FILE`, written on first use.

        The id belongs to the messages, not the path: a copied or moved Maildir answers
        lookups for the same sends and keeps its identity; an empty folder elsewhere is
        another outbox. Written by a hard link from a temporary file, so concurrent first
        uses agree on one id. A folder that cannot be written falls back to its path.
        """
        target = self._dir / OUTBOX_ID_FILE
        try:
            if not target.exists():
                self._dir.mkdir(parents=True, exist_ok=True)
                tmp = self._dir / f".{OUTBOX_ID_FILE}.{os.getpid()}.{threading.get_ident()}"
                tmp.write_text(uuid.uuid4().hex, encoding="ascii")
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    pass
                finally:
                    tmp.unlink(missing_ok=True)
            with target.open("rb") as f:
                return f.read(MAX_ID_BYTES).decode("ascii", "replace").strip()
        except OSError:
            return f"path:{self._dir.resolve()}"

    def _delivered(self, key: OperationKey) -> tuple[MimeMessage | None, bool]:
        """The headers of the file holding `key`'s message, and whether its name holds another.

        Only a file under the current name blocks a send; one under the older name that holds
        another key is that key's delivery on a case-insensitive disk, and is left alone.
        """
        current = file_name(key)
        other = False
        for folder in ("new", "cur"):
            for name in dict.fromkeys((current, legacy_file_name(key))):
                path = self._dir / folder / name
                if not path.exists():
                    continue
                headers = stored_headers(path)
                if _named_key(headers) == str(key):
                    return headers, False
                other = other or name == current
        return None, other

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if idempotency_key != str(message.key):
            raise ValueError("the idempotency key must be the message's operation key")
        name = file_name(message.key)
        message_id = dict(message.headers).get("Message-ID", idempotency_key)
        try:
            delivered, other = self._delivered(message.key)
        except OSError as e:
            return _transient(e)
        if delivered is not None:
            return SendOutcome.sent(message_id, duplicate=True)
        if other:
            return SendOutcome.failed(FailureClass.PERMANENT, NAME_HOLDS_OTHER_KEY)
        keyed = _with_key_header(message)
        if keyed is None:
            return SendOutcome.failed(FailureClass.PERMANENT, KEY_HEADER_MISMATCH)
        try:
            data = to_bytes(keyed)
        except RenderError as e:
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        try:
            return self._write(message.key, name, data, message_id)
        except OSError as e:
            # Nothing reached new/ (the link is the delivery), so trying again later is safe.
            return _transient(e)

    def _write(self, key: OperationKey, name: str, data: bytes, message_id: str) -> SendOutcome:
        for folder in ("tmp", "new", "cur"):
            (self._dir / folder).mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._counter += 1
            unique = f"{os.getpid()}.{threading.get_ident()}.{self._counter}"
        tmp = self._dir / "tmp" / f"{unique}.{name}"
        target = self._dir / "new" / name
        try:
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, target)
            except FileExistsError:
                # Another writer got there first; it counts only if it wrote this key (on a
                # case-insensitive disk the name can also be another key's).
                if stored_key(target) == str(key):
                    return SendOutcome.sent(message_id, duplicate=True)
                return SendOutcome.failed(FailureClass.PERMANENT, NAME_HOLDS_OTHER_KEY)
        finally:
            tmp.unlink(missing_ok=True)
        return SendOutcome.sent(message_id)

    def lookup(self, idempotency_key: str) -> LookupResult:
        headers, _ = self._delivered(OperationKey.parse(idempotency_key))
        if headers is None:
            return LookupResult(LookupStatus.NOT_FOUND)
        return LookupResult(LookupStatus.FOUND, headers.get("Message-ID"))

    def stored(self) -> list[Path]:
        """Every delivered file (new/ and cur/), for tests and the simulator."""
        return sorted(
            p
            for folder in ("new", "cur")
            if (self._dir / folder).is_dir()
            for p in (self._dir / folder).iterdir()
        )


def _transient(e: OSError) -> SendOutcome:
    code = errno.errorcode.get(e.errno or 0, "oserror")
    return SendOutcome.failed(FailureClass.TRANSIENT, f"outbox:{code}")
