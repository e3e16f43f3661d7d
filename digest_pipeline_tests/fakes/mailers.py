"""Mailers for the tests: a provider simulation with scripted faults, and wrappers that inject faults.

`FakeMailer` keeps its own record of deliveries, deduplicates idempotency keys inside a window and
can be scripted per key, including a timeout after the provider accepted and a worker crash right
after it; the wrappers give a real mailer the same faults.
"""

import enum
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import LookupResult, LookupStatus, MailerCapabilities, Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports.outside import Clock, Mailer


class WorkerCrash(BaseException):
    """The worker process died (here: right after the provider accepted a message).

    A `BaseException`, so the services' ordinary `except Exception` cannot swallow it: the test
    catches it where the process would have died and then checks what a restart does.
    """


class ScriptedFault(enum.Enum):
    """Scripted provider behaviours that are more than a returned outcome."""

    #: the provider accepts (and delivers), but the caller sees a timeout (`unknown`)
    ACCEPTED_THEN_TIMEOUT = "accepted_then_timeout"
    #: the provider accepts (and delivers), then the worker process dies (`WorkerCrash`)
    CRASH_AFTER_ACCEPT = "crash_after_accept"


Scripted = SendOutcome | ScriptedFault

#: What the caller sees after `ACCEPTED_THEN_TIMEOUT`.
TIMEOUT_AFTER_SEND = SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send")


@dataclass(frozen=True)
class Delivery:
    """One message the simulated provider actually delivered."""

    idempotency_key: str
    provider_message_id: str
    message: Message
    #: when it was delivered (None when the mailer has no clock)
    at: datetime | None


class FakeMailer(Mailer):
    """A provider simulation: deliveries, idempotency window, lookup and scripted faults.

    Every send of a key takes the next scripted behaviour of that key, if any:

    * a scripted `SendOutcome` is returned as-is and the provider records nothing (script a
      failure this way; to have a send really accepted, let the key's queue run out);
    * `ACCEPTED_THEN_TIMEOUT`: the provider processes the send as accepted (deduplicating as
      below), and the caller gets `unknown` / `timeout_after_send`;
    * `CRASH_AFTER_ACCEPT`: the same, then `WorkerCrash` is raised.

    An accepted send of a key already delivered is suppressed by an idempotent provider if the
    last delivery is inside the window (always, when no clock or no window is given): nothing is
    delivered and the caller gets `sent(<same id>, duplicate=True)`. A non-idempotent provider
    delivers every accepted send.
    """

    ACCEPTED_THEN_TIMEOUT: ClassVar[ScriptedFault] = ScriptedFault.ACCEPTED_THEN_TIMEOUT
    #: `remote` when a test does not say: a provider's round trip (sends on a pool), or, set by
    #: the `both_mailer_kinds` fixture, a local call (ledger calls overlapped with composing)
    remote_default: ClassVar[bool] = True

    def __init__(
        self,
        *,
        idempotent: bool = True,
        idempotency_window: timedelta | None = timedelta(hours=24),
        can_lookup: bool = True,
        clock: Clock | None = None,
        remote: bool | None = None,
    ) -> None:
        if idempotency_window is not None and idempotency_window <= timedelta(0):
            raise ValueError("idempotency_window must be positive")
        self._idempotent = idempotent
        self._window = idempotency_window
        self._can_lookup = can_lookup
        self._clock = clock
        self._remote = FakeMailer.remote_default if remote is None else remote
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Scripted]] = {}
        self._deliveries: list[Delivery] = []
        self._last_delivery: dict[str, Delivery] = {}
        self._sends: Counter[str] = Counter()
        self._suppressed = 0
        self._next_id = 0

    # -- arranging -----------------------------------------------------------------------
    def script(self, key: str | OperationKey, *outcomes: Scripted) -> None:
        """Queues behaviours for the next sends of `key`; afterwards its sends succeed."""
        with self._lock:
            self._scripts.setdefault(str(key), []).extend(outcomes)

    def script_timeout_after_accept(self, key: str | OperationKey) -> None:
        self.script(key, ScriptedFault.ACCEPTED_THEN_TIMEOUT)

    def script_crash_after_accept(self, key: str | OperationKey) -> None:
        self.script(key, ScriptedFault.CRASH_AFTER_ACCEPT)

    # -- the port --------------------------------------------------------------------------
    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(
            self._window if self._idempotent else None, self._can_lookup, self._remote
        )

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if idempotency_key != str(message.key):
            raise AssertionError(
                f"idempotency key {idempotency_key!r} is not the message's operation key"
                f" {str(message.key)!r}"
            )
        with self._lock:
            self._sends[idempotency_key] += 1
            queue = self._scripts.get(idempotency_key)
            scripted = queue.pop(0) if queue else None
            if isinstance(scripted, SendOutcome):
                return scripted
            accepted = self._accept_locked(message, idempotency_key)
        if scripted is ScriptedFault.ACCEPTED_THEN_TIMEOUT:
            return TIMEOUT_AFTER_SEND
        if scripted is ScriptedFault.CRASH_AFTER_ACCEPT:
            raise WorkerCrash(f"worker died after the provider accepted {idempotency_key}")
        return accepted

    def lookup(self, idempotency_key: str) -> LookupResult:
        if not self._can_lookup:
            return LookupResult(LookupStatus.UNSUPPORTED)
        with self._lock:
            last = self._last_delivery.get(idempotency_key)
        if last is None:
            return LookupResult(LookupStatus.NOT_FOUND)
        return LookupResult(LookupStatus.FOUND, last.provider_message_id)

    def _accept_locked(self, message: Message, key: str) -> SendOutcome:
        now = self._clock.now() if self._clock is not None else None
        last = self._last_delivery.get(key)
        if last is not None and self._idempotent and self._inside_window(last, now):
            self._suppressed += 1
            return SendOutcome.sent(last.provider_message_id, duplicate=True)
        self._next_id += 1
        delivery = Delivery(key, f"msg-{self._next_id}", message, now)
        self._deliveries.append(delivery)
        self._last_delivery[key] = delivery
        return SendOutcome.sent(delivery.provider_message_id)

    def _inside_window(self, last: Delivery, now: datetime | None) -> bool:
        if self._window is None or now is None or last.at is None:
            return True
        return now < last.at + self._window

    # -- inspecting ------------------------------------------------------------------------
    @property
    def deliveries(self) -> list[tuple[str, str, Message]]:
        """(idempotency key, provider message id, message) of every delivery, in order."""
        with self._lock:
            return [(d.idempotency_key, d.provider_message_id, d.message) for d in self._deliveries]

    @property
    def sent_messages(self) -> list[Message]:
        """Every delivered message, in order."""
        with self._lock:
            return [d.message for d in self._deliveries]

    def deliveries_for(self, key: str | OperationKey) -> int:
        k = str(key)
        with self._lock:
            return sum(1 for d in self._deliveries if d.idempotency_key == k)

    @property
    def duplicate_deliveries(self) -> int:
        """Messages a recipient got more than once: sum over keys of (deliveries - 1)."""
        with self._lock:
            per_key = Counter(d.idempotency_key for d in self._deliveries)
        return sum(max(0, n - 1) for n in per_key.values())

    @property
    def suppressed_duplicates(self) -> int:
        """Accepted sends the provider recognised by key and did not deliver again."""
        with self._lock:
            return self._suppressed

    @property
    def sends(self) -> int:
        """Every call to `send`."""
        with self._lock:
            return sum(self._sends.values())

    def sends_for(self, key: str | OperationKey) -> int:
        with self._lock:
            return self._sends[str(key)]


class WrappingMailer(Mailer):
    """A mailer around another: its capabilities and lookups are the inner mailer's."""

    def __init__(self, inner: Mailer) -> None:
        self._inner = inner

    @property
    def capabilities(self) -> MailerCapabilities:
        return self._inner.capabilities

    @property
    def identity(self) -> str:
        return self._inner.identity

    def lookup(self, idempotency_key: str) -> LookupResult:
        return self._inner.lookup(idempotency_key)


class FaultInjectingMailer(WrappingMailer):
    """Wraps a real mailer: the provider really accepts, then the caller sees a fault.

    It turns the outbox or the HTTP provider into a participant of the crash-point tests: the
    provider's own store, not this wrapper, says how many messages were delivered.
    """

    def __init__(self, inner: Mailer) -> None:
        super().__init__(inner)
        self._crash: set[str] = set()
        self._timeout: set[str] = set()

    def crash_after_accept(self, key: str | OperationKey) -> None:
        self._crash.add(str(key))

    def timeout_after_accept(self, key: str | OperationKey) -> None:
        self._timeout.add(str(key))

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        outcome = self._inner.send(message, idempotency_key=idempotency_key)
        if idempotency_key in self._crash and outcome.accepted:
            self._crash.discard(idempotency_key)
            raise WorkerCrash(f"worker died after the provider accepted {idempotency_key}")
        if idempotency_key in self._timeout and outcome.accepted:
            self._timeout.discard(idempotency_key)
            return TIMEOUT_AFTER_SEND
        return outcome


class SystemicFailureMailer(WrappingMailer):
    """Wraps a mailer: while `failing` is set, every send answers it (a revoked API key: 401)
    without reaching the inner mailer; otherwise the inner mailer sends. Counts every send."""

    def __init__(self, inner: Mailer, failing: SendOutcome | None = None) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._sends: Counter[str] = Counter()
        self.failing = failing

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        with self._lock:
            self._sends[idempotency_key] += 1
            failing = self.failing
        if failing is not None:
            return failing
        return self._inner.send(message, idempotency_key=idempotency_key)

    @property
    def sends(self) -> int:
        """Every call to `send`, answered by `failing` or passed on."""
        with self._lock:
            return self._sends.total()
