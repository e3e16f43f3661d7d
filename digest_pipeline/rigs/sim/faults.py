"""The simulated email provider: a seeded, fault-injecting `Mailer` with its own delivery store.

The store is the provider's truth, as a real provider's logs would be: every accepted message
per idempotency key, whether or not the caller heard about it. An idempotent provider answers a
repeated key inside its window with the first message's id and delivers nothing; a
non-idempotent one delivers again. It cannot look keys up (like SMTP and most HTTP APIs), so an
`unknown` outcome is settled only by the ledger's own evidence or by an idempotent resend.
"""

import hashlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports import Mailer
from digest_pipeline.rigs.sim.config import FaultMix
from digest_pipeline.rigs.sim.scheduler import Scheduler

#: how long the provider remembers an idempotency key (Resend-style APIs: 24 h)
IDEMPOTENCY_WINDOW = timedelta(hours=24)
#: the provider's `Retry-After` on a throttled send
THROTTLE_RETRY_AFTER = timedelta(seconds=60)
#: a refused connection during the outage fails fast, which is what makes a herd possible
REFUSED_LATENCY = timedelta(milliseconds=10)
#: the client's timeout (DIGEST_PROVIDER_TIMEOUT_SECONDS' default): a send whose answer is lost
#: keeps its attempt open this long
CLIENT_TIMEOUT = timedelta(seconds=10)


class SimulatedCrash(BaseException):
    """The worker process died at a crash point (after a send, or after a cleanup commit).

    A `BaseException`, so the services' `except Exception` cannot swallow it; the simulator
    catches it where the process would have died. A lost cleanup acknowledgement carries the key
    and token, so the retried step can redeliver that key's cleanup.
    """

    def __init__(self, what: str, key: OperationKey | None = None, token: int = 0) -> None:
        super().__init__(what)
        self.key = key
        self.token = token


def unit(seed: int, *parts: object) -> float:
    """A deterministic draw in [0, 1) for (seed, parts).

    The same inputs give the same number in every process and run, unlike `hash()`, which
    Python salts per process.
    """
    text = "|".join(str(p) for p in (seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class Delivery:
    """One message the provider really delivered."""

    at: datetime
    provider_message_id: str


class SimProvider(Mailer):
    """A provider on virtual time: latency, the failure mix, the outage and the crash points."""

    def __init__(self, faults: FaultMix, seed: int, scheduler: Scheduler, start: datetime) -> None:
        self._faults = faults
        self._seed = seed
        self._sched = scheduler
        self._start = start
        self._deliveries: dict[str, list[Delivery]] = {}
        self._sends: Counter[str] = Counter()
        self._suppressed = 0
        self._refused = 0
        self._crashed: list[str] = []
        self._timed_out: list[str] = []
        self._next_id = 0

    @property
    def capabilities(self) -> MailerCapabilities:
        window = IDEMPOTENCY_WINDOW if self._faults.provider_idempotent else None
        # Not `remote`: a remote mailer's sends run on a pool thread, and this one's latency is
        # a sleep on the scheduler, which belongs to the actor's own thread. From a pool thread
        # it would hand the baton on while the actor's thread goes on composing the next wave,
        # so under load a worker's ledger calls would race the scheduler's sweeps and lease
        # recoveries, and a cell would send only some of its digests. The latency is virtual:
        # there is no real wait to overlap anyway.
        return MailerCapabilities(idempotency_window=window, can_lookup=False, remote=False)

    def _permanent(self, key: str) -> bool:
        return unit(self._seed, key, "permanent") < self._faults.permanent_rate

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        key, f = idempotency_key, self._faults
        if key != str(message.key):
            raise ValueError("the idempotency key must be the message's operation key")
        self._sends[key] += 1
        if f.in_outage(self._sched.now - self._start):
            self._sched.sleep(REFUSED_LATENCY)
            self._refused += 1
            return SendOutcome.failed(FailureClass.TRANSIENT, "sim:connection_refused")
        self._sched.sleep(f.send_latency)
        if self._permanent(key):
            return SendOutcome.failed(FailureClass.PERMANENT, "sim:550_suppressed")
        u = unit(self._seed, key, self._sends[key], "send")
        if (u := u - f.transient_rate) < 0:
            return SendOutcome.failed(FailureClass.TRANSIENT, "sim:503")
        if (u := u - f.throttle_rate) < 0:
            return SendOutcome.failed(
                FailureClass.THROTTLED, "sim:429", retry_after=THROTTLE_RETRY_AFTER
            )
        if (u := u - f.timeout_after_accept_rate) < 0:
            self._accept(key)
            self._timed_out.append(key)
            self._sched.sleep(max(CLIENT_TIMEOUT - f.send_latency, timedelta(0)))
            return SendOutcome.failed(FailureClass.UNKNOWN, "sim:timeout_after_accept")
        if u - f.crash_after_send_rate < 0:
            self._accept(key)
            self._crashed.append(key)
            self._sched.current.crashed = True
            raise SimulatedCrash(f"worker died after the provider accepted {key}")
        return self._accept(key)

    def _accept(self, key: str) -> SendOutcome:
        now = self._sched.now
        delivered = self._deliveries.setdefault(key, [])
        if (
            delivered
            and self._faults.provider_idempotent
            and now < delivered[0].at + IDEMPOTENCY_WINDOW
        ):
            self._suppressed += 1
            return SendOutcome.sent(delivered[0].provider_message_id, duplicate=True)
        self._next_id += 1
        delivery = Delivery(now, f"sim-{self._next_id:08d}")
        delivered.append(delivery)
        return SendOutcome.sent(delivery.provider_message_id)

    # -- the provider's own store ----------------------------------------------------------
    def deliveries_per_key(self) -> dict[str, int]:
        """Messages delivered per idempotency key (keys never delivered are absent)."""
        return {k: len(v) for k, v in self._deliveries.items() if v}

    def last_delivery_at(self) -> datetime | None:
        times = [d.at for v in self._deliveries.values() for d in v]
        return max(times) if times else None

    @property
    def sends(self) -> int:
        """Every request the provider received."""
        return sum(self._sends.values())

    @property
    def suppressed(self) -> int:
        """Repeated keys the provider recognised and did not deliver again."""
        return self._suppressed

    @property
    def refused(self) -> int:
        """Sends refused by the outage."""
        return self._refused

    @property
    def crashed_keys(self) -> list[str]:
        """Keys whose sender died right after the provider accepted them, in order."""
        return list(self._crashed)

    @property
    def timed_out_keys(self) -> list[str]:
        """Keys accepted whose answer the caller never got, in order."""
        return list(self._timed_out)
