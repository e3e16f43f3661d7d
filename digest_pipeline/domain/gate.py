"""The cleanup gate: generated rows may be removed only once delivery is confirmed.

Removing the rows of an item that is `unknown`, `failed` or dead-lettered would destroy the
evidence an operator needs, so only `sent` opens the gate; the SQL compare-and-set enforces it
again inside the cleanup transaction.
"""

from dataclasses import dataclass

from digest_pipeline.domain.states import DeliveryState


@dataclass(frozen=True)
class GateDecision:
    """Whether cleanup may run for one item, and why not when it may not."""

    open: bool
    reason: str


def cleanup_gate(state: DeliveryState) -> GateDecision:
    """Open only for `sent`; `cleaned` is reported as already done, anything else as not sent."""
    if state is DeliveryState.SENT:
        return GateDecision(True, "sent")
    if state is DeliveryState.CLEANED:
        return GateDecision(False, "already_cleaned")
    return GateDecision(False, f"not_sent:{state.value}")
