"""The ports to the world outside the ledger: the clock, the shop's data, the mailer, the composer.

Each has a real adapter under `adapters/` and a hand-written fake in the tests.
"""

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime

from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.compliance import Compliance
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    Customer,
    DigestRow,
    LookupResult,
    LookupStatus,
    MailerCapabilities,
    Message,
    WorkItem,
)


class Clock(ABC):
    """The only source of "now" for the core, so tests and the simulator control time."""

    @abstractmethod
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class CustomerSource(ABC):
    """The shop's records: customers, its product catalogue and its order lines.

    Customers are read when a period's eligibility is frozen; the catalogue and the orders when
    the period's digest content is generated.
    """

    @abstractmethod
    def customers(self) -> Iterator[Customer]:
        """Streams every customer; the eligibility rule is applied by the snapshot service."""

    @abstractmethod
    def products(self) -> Iterator[Product]:
        """Streams the whole catalogue, in product id order."""

    @abstractmethod
    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        """Streams the order lines with `since <= ordered_at < until`, oldest first."""

    def popularity(self, since: datetime, until: datetime) -> Counter[str]:
        """Order lines per product id in `[since, until)`: the ranking content picks from.

        This default counts `orders`; a database source counts where the rows are.
        """
        return Counter(o.product_id for o in self.orders(since, until))

    def orders_of(
        self, customer_ids: Sequence[str], since: datetime, until: datetime
    ) -> Iterator[Order]:
        """`orders`, only those of `customer_ids`, in no particular order.

        Content generation asks this a chunk of customers at a time, so a period's order lines
        never sit in memory together. This default reads the whole window on every call, which
        is quadratic over a period: a source holding many orders must override it with a lookup
        by customer.
        """
        wanted = frozenset(customer_ids)
        if wanted:
            yield from (o for o in self.orders(since, until) if o.customer_id in wanted)


class Mailer(ABC):
    """Sends one rendered digest with the operation key as its idempotency key."""

    @property
    @abstractmethod
    def capabilities(self) -> MailerCapabilities:
        """Whether the provider deduplicates keys (and for how long) and can look them up."""

    @abstractmethod
    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        """Sends; every failure comes back as a classified outcome, never as an exception."""

    def lookup(self, idempotency_key: str) -> LookupResult:
        """Asks whether a key was accepted; mailers that cannot answer say UNSUPPORTED."""
        return LookupResult(LookupStatus.UNSUPPORTED)

    def prepare(self) -> None:  # noqa: B027 - most mailers build nothing on a first send
        """Builds, without any network traffic, what a first send would otherwise build.

        A paced run calls it before its first slot: a first request slowed by building a
        client would reach the provider late, right before the next one, crowding its window.
        """

    def close(self) -> None:  # noqa: B027 - most mailers hold nothing to release
        """Releases connections; the mailer may be used again afterwards (it reconnects)."""

    @property
    def identity(self) -> str:
        """Its kind and a non-secret digest of its endpoint (`domain.mailer_identity`).

        Each attempt records it; a lookup or an idempotent resend counts as evidence only for
        the attempts this identity made. The real mailers name their endpoint; this default,
        the class's name, serves a mailer that only one process can reach (a test's).
        """
        return type(self).__name__


class Composer(ABC):
    """Renders one customer's digest; a failure raises RenderError (a permanent failure)."""

    @abstractmethod
    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        """The message for one work item."""

    @property
    def unsubscribe_secret(self) -> str | None:
        """The secret its unsubscribe links are signed with; None for a composer signing none."""
        return None

    @property
    def compliance(self) -> Compliance | None:
        """The unsubscribe link and postal address its digests carry; None: it renders neither."""
        return None
