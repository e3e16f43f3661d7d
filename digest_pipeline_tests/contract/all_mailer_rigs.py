"""Every mailer's rig by its `DIGEST_MAILER` name: what the mailer contract suites run over."""

from collections.abc import Mapping

from digest_pipeline_tests.contract.mailer_rigs import (
    FakeRig,
    HttpRig,
    MailerRig,
    OutboxRig,
    PostmarkRig,
    SendGridRig,
    SmtpRig,
)
from digest_pipeline_tests.contract.ses_rig import SesRig

RIGS: Mapping[str, type[MailerRig]] = {
    rig.name: rig
    for rig in (FakeRig, OutboxRig, HttpRig, PostmarkRig, SendGridRig, SesRig, SmtpRig)
}
#: the mailers that talk to a peer across a connection
PEER_RIGS = ("http", "postmark", "sendgrid", "ses", "smtp")
