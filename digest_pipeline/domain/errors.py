"""Named errors of the core, so that adapters and the CLI can tell a refusal from a crash.

Every message is one line and carries only operation keys, customer ids and periods, never an
address or digest content.
"""


class DigestError(Exception):
    """Base of every error the project raises on purpose."""


class InvalidPeriod(DigestError, ValueError):
    """A period was not `YYYY-Www` (an existing ISO week) or that week's Monday `YYYY-MM-DD`."""


class InvalidOperationKey(DigestError, ValueError):
    """An operation key was not `<instance>:<period>:<customer_id>`."""


class InvalidInstanceName(DigestError, ValueError):
    """A digest instance's name was not a lower-case letter and up to 21 more of `a-z0-9_`."""


class InvalidCustomerId(DigestError, ValueError):
    """A customer id was empty or held characters an operation key cannot carry."""


class InvalidTransition(DigestError):
    """A work item was asked to move between two states that the transition table forbids."""


class LostRace(DigestError):
    """A compare-and-set matched zero rows: another worker or operator changed the item first."""


class UnknownWorkItem(DigestError, LookupError):
    """No work item exists for the operation key."""


class SnapshotMissing(DigestError, LookupError):
    """The period has no frozen eligibility snapshot yet."""


class ReplayRefused(DigestError):
    """A replay request was refused as a whole; nothing was changed."""


class ResolveRefused(DigestError):
    """An operator resolution was refused; nothing was changed."""


class RenderError(DigestError):
    """The digest for one item could not be rendered; a permanent failure for that item."""


class InvalidRecipient(RenderError):
    """The item's recipient address cannot be addressed; a permanent failure for that customer.

    Not one plain address, or one the header rules or an SMTP envelope refuse: the customer's
    data is at fault, not a product, template or setting every digest shares.
    """


class InvalidPolicy(DigestError, ValueError):
    """A retry or delivery bound is out of range."""


class LateWeekRefused(DigestError):
    """A run of a week whose delivery window closed before any attempt was refused."""


class LedgerMismatch(DigestError):
    """A process resolved another ledger than the one its run was started with; it refused."""


class DeliveryHelperFailed(DigestError):
    """A delivery helper process (`runtime.helpers`) failed or ended without its report."""


class PossibleDuplicateRefused(ReplayRefused):
    """A replay was refused because a key may already have been delivered; nothing was changed.

    `keys` names them; replaying them needs the operator's explicit acceptance of a possible
    second copy.
    """

    def __init__(self, message: str, keys: tuple[str, ...]) -> None:
        super().__init__(message)
        self.keys = keys


class SnapshotTampered(DigestError):
    """A period's frozen eligibility snapshot no longer matches its fingerprint; it was refused.

    Nothing of the period is sent or cleaned while it does not match (design §4, invariant 5).
    `period` is the period as text (`2026-W42`).
    """

    def __init__(self, message: str, period: str) -> None:
        super().__init__(message)
        self.period = period


class BreakerOpen(DigestError):
    """A delivery run stopped: too many consecutive attempts failed with the same code.

    The attempts it started are recorded; what it had not attempted is left due.
    """


class SendingPaused(BreakerOpen):
    """A delivery run stopped: the provider's rate limit or quota paused every sender.

    As with the breaker, the attempts it started are recorded and the rest is left due; the
    pause is in the ledger, so no other sender of the install sends before it ends.
    """


class RunSettingsMismatch(DigestError):
    """A step process's `DIGEST_*` settings are not those its run was launched with; it refused."""
