"""Hand-written fakes of the ports (style §5, "Fakes, not mocks"), one module per kind.

State goes in through the constructors and tests inspect through read-only properties; every
name is re-exported here, so a test imports it from `digest_pipeline_tests.fakes`.
"""

from digest_pipeline_tests.fakes.clock import FixedClock
from digest_pipeline_tests.fakes.composers import FakeComposer, PortableComposer
from digest_pipeline_tests.fakes.ledger import FakeLedger, FakeSecretFingerprints
from digest_pipeline_tests.fakes.ledger_base import ArchivedRow, CleanupRecord
from digest_pipeline_tests.fakes.mailers import (
    TIMEOUT_AFTER_SEND,
    Delivery,
    FakeMailer,
    FaultInjectingMailer,
    Scripted,
    ScriptedFault,
    SystemicFailureMailer,
    WorkerCrash,
    WrappingMailer,
)
from digest_pipeline_tests.fakes.sources import FakeCustomerSource

__all__ = [
    "TIMEOUT_AFTER_SEND",
    "ArchivedRow",
    "CleanupRecord",
    "Delivery",
    "FakeComposer",
    "FakeCustomerSource",
    "FakeLedger",
    "FakeMailer",
    "FakeSecretFingerprints",
    "FaultInjectingMailer",
    "FixedClock",
    "PortableComposer",
    "Scripted",
    "ScriptedFault",
    "SystemicFailureMailer",
    "WorkerCrash",
    "WrappingMailer",
]
