"""Which digests may have their generated rows replaced, and what a replacement did.

Only a digest that has never left may change: an item that is `claimed` may be rendering its
rows right now, one that is `sent` or `cleaned` was delivered with them, and one that is
`unknown` may have been; their rows are evidence and stay as they are.
"""

from dataclasses import dataclass, field

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState

#: states whose digest was never sent: the only ones whose rows may be regenerated
REGENERABLE: frozenset[DeliveryState] = frozenset(
    {
        DeliveryState.PENDING,
        DeliveryState.RETRY_SCHEDULED,
        DeliveryState.FAILED,
        DeliveryState.DEAD_LETTERED,
    }
)


@dataclass(frozen=True)
class RowReplacement:
    """What one `Ledger.replace_digest_rows` call did, in one transaction."""

    #: keys whose old rows were deleted and whose new rows were written
    replaced: frozenset[OperationKey] = frozenset()
    #: keys left alone, with the state that refused them (None: the key has no work item)
    refused: dict[OperationKey, DeliveryState | None] = field(default_factory=dict)
    #: old rows deleted
    removed: int = 0
    #: new rows written
    written: int = 0


class RegenerateRefused(DigestError):
    """A regeneration request was refused as a whole; nothing was changed."""
