"""The abstract interfaces between the services and the outside world (design §5).

Every port has a real adapter under `adapters/` and a hand-written fake in the tests; the
contract suite runs the same assertions over both. `outside` holds the ports to the world
beyond the ledger, `ledger_roles` the ledger's role ports, `feedback` the store `digest serve`
records into and `ledger` the roles' aggregate. Services import those modules, not this package,
which would bring the aggregate with it.
"""

from digest_pipeline.ports.feedback import FeedbackStore
from digest_pipeline.ports.ledger import Ledger
from digest_pipeline.ports.ledger_roles import (
    AuditTrail,
    Cleaner,
    ContentBacklog,
    ContentStore,
    HasSecretFingerprints,
    HasSendBudget,
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
    "ContentBacklog",
    "ContentStore",
    "CustomerSource",
    "FeedbackStore",
    "HasSecretFingerprints",
    "HasSendBudget",
    "Ledger",
    "Mailer",
    "ReadModel",
    "SecretFingerprints",
    "SendBudget",
    "SnapshotStore",
    "SuppressionList",
    "WorkQueue",
]
