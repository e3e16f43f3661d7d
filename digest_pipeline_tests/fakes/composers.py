"""Composers that render a plain-text digest of the rows' titles, and fail on request per customer."""

import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import DigestRow, Message, WorkItem, message_id_for
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports.outside import Composer


class FakeComposer(Composer):
    """Renders a plain-text digest listing each row's title; can be told to fail per customer."""

    SENDER: ClassVar[str] = "digest@example.com"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._composed: list[OperationKey] = []

    def fail_for(self, customer_id: str) -> None:
        with self._lock:
            self._failing.add(customer_id)

    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        key = item.key
        with self._lock:
            if key.customer_id in self._failing:
                raise RenderError(f"render failed for {key}")
            self._composed.append(key)
        titles = [str(r.payload["title"]) for r in rows if "title" in r.payload]
        text = "\n".join([f"Your digest for {key.period}", "", *(f"- {t}" for t in titles)])
        return Message(
            key=key,
            recipient=recipient,
            sender=self.SENDER,
            subject=f"Your digest for {key.period}",
            text=text,
            headers=(("Message-ID", message_id_for(key)), ("X-Digest-Operation-Key", str(key))),
        )

    @property
    def composed(self) -> list[OperationKey]:
        """Keys rendered successfully, in order."""
        with self._lock:
            return list(self._composed)


class PortableComposer(FakeComposer):
    """The fake composer, which a delivery helper process can make for itself (`recipe`)."""

    def recipe(self) -> Callable[[], Composer]:
        return PortableComposer
