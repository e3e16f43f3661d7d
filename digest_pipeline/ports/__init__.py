"""The abstract interfaces between the services and the outside world (design §5).

Every port has a real adapter under `adapters/` and a hand-written fake in the tests; the
contract suite runs the same assertions over both. `outside` holds the ports to the world
beyond the ledger, `ledger_roles` the ledger's role ports and `ledger` their aggregate.
"""

from digest_pipeline.ports.ledger import FeedbackStore, Ledger
from digest_pipeline.ports.ledger_roles import (
    AuditTrail,
    Cleaner,
    ContentStore,
    ReadModel,
    SecretFingerprints,
    SendBudget,
    SnapshotStore,
    SuppressionList,
    WorkQueue,
)
from digest_pipeline.ports.outside import Clock, Composer, CustomerSource, Mailer

__all__ = [
    "AuditTrail",
    "Cleaner",
    "Clock",
    "Composer",
    "ContentStore",
    "CustomerSource",
    "FeedbackStore",
    "Ledger",
    "Mailer",
    "ReadModel",
    "SecretFingerprints",
    "SendBudget",
    "SnapshotStore",
    "SuppressionList",
    "WorkQueue",
]
