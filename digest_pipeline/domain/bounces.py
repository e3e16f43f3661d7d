"""A relay's permanent refusal of the recipient's mailbox is a hard bounce: the customer is suppressed.

RFC 3463's enhanced status codes say which refusals are about the mailbox itself: X.1.1 (no
such mailbox), X.1.2 (no such domain), X.1.3 (bad address syntax), X.1.6 (mailbox moved),
X.1.10 (the domain accepts no mail, RFC 7505) and X.2.1 (mailbox disabled). Only a permanent
(5.x.x) one counts: a 4.x.x may pass. A bare 550 without an enhanced code is often a policy
refusal (spam, rate, reputation) and is left to the operator; so are X.1.7 and X.1.8, which are
about the sender's address, not the recipient's.
"""

import re
from datetime import datetime

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import Suppression, SuppressionReason

#: `smtp:<reply code>:<enhanced code>` of a permanent refusal of the recipient's mailbox
_HARD_BOUNCE = re.compile(r"smtp:5\d\d:5\.(?:1\.(?:1|2|3|6|10)|2\.1)")
#: what a suppression recorded from an attempt's outcome names as its source
SOURCE_PREFIX = "mailer:"


def hard_bounce(customer_id: str, outcome: SendOutcome, at: datetime) -> Suppression | None:
    """The `hard_bounce` suppression a permanent refusal of the mailbox means, or None."""
    if outcome.failure_class is not FailureClass.PERMANENT:
        return None
    if not _HARD_BOUNCE.fullmatch(outcome.detail):
        return None
    return Suppression(
        customer_id, SuppressionReason.HARD_BOUNCE, f"{SOURCE_PREFIX}{outcome.detail}", at
    )
