"""The combinations of the ledger's roles that more than one service takes, each named once.

A service that needs a single role names it from `ports.ledger_roles`; one that needs a
combination only it uses defines that beside itself.
"""

from typing import Protocol

from digest_pipeline.ports.ledger_roles import ReadModel, SnapshotStore, WorkQueue


class PeriodReader(SnapshotStore, ReadModel, Protocol):
    """A period's frozen snapshot and what is recorded of its items, as refusals and figures read."""


class WorkLedger(ReadModel, WorkQueue, Protocol):
    """The work items, read and moved by guarded transitions: what settles an `unknown` item."""
