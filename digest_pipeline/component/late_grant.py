"""A late window granted from the UI: a run of a missed week launched with two tags.

`digest/deliver_late` holds the reason and `digest/operator` who grants it (one of
`DIGEST_OPERATORS` when that lists names). The week's first step records the same audited row
`digest run --deliver-late` records, the run's id in its reason (guards.py `week_refusal`); a
week whose window is open needs no grant and gets none.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import dagster as dg

from digest_pipeline.component.resources import DeliverySettings
from digest_pipeline.domain.periods import Period
from digest_pipeline.operators import MAX_OPERATOR, MAX_REASON, operator_grants
from digest_pipeline.ports import Clock, Ledger
from digest_pipeline.services import period_gate
from digest_pipeline.settings import InvalidSetting

#: the run tag holding why a missed week is sent late (the launchpad's or backfill's tags)
DELIVER_LATE_TAG = "digest/deliver_late"
#: the run tag naming who grants it
OPERATOR_TAG = "digest/operator"


def _tag_refusal(operator: str, reason: str, operators: frozenset[str]) -> str | None:
    """Why the tags cannot grant a late window, or None."""
    if not operator:
        return f"the tag {DELIVER_LATE_TAG} needs the tag {OPERATOR_TAG} naming who grants it"
    if not reason:
        return f"the tag {DELIVER_LATE_TAG} must say why the week is sent late"
    if not (operator.isprintable() and reason.isprintable()):
        return f"the tags {OPERATOR_TAG} and {DELIVER_LATE_TAG} must be one line of text"
    if len(operator) > MAX_OPERATOR or len(reason) > MAX_REASON:
        return (
            f"the tag {OPERATOR_TAG} takes at most {MAX_OPERATOR} characters and "
            f"{DELIVER_LATE_TAG} at most {MAX_REASON}"
        )
    try:
        names = operator_grants(operators)
    except InvalidSetting as e:  # as the CLI refuses every operator command then
        return str(e)
    if names and operator not in names:
        allowed = ", ".join(sorted(names))
        return (
            f"operator {operator!r} may not grant a late window: DIGEST_OPERATORS allows {allowed}"
        )
    return None


@dataclass(frozen=True)
class LateRequest:
    """A run's request for a late window: who grants it and why."""

    operator: str
    reason: str


def late_request(tags: Mapping[str, str], operators: frozenset[str]) -> LateRequest | str | None:
    """The run's late request; the line refusing its tags; or None when it asks for none."""
    if DELIVER_LATE_TAG not in tags:
        return None
    operator = tags.get(OPERATOR_TAG, "").strip()
    reason = tags[DELIVER_LATE_TAG].strip()
    if (why := _tag_refusal(operator, reason, operators)) is not None:
        return why
    return LateRequest(operator, reason)


def record_grant(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
    settings: DeliverySettings,
    clock: Clock,
    period: Period,
    request: LateRequest,
) -> None:
    """Records `request`'s grant for a missed week, the run's id ending its reason."""
    run_id = context.run.run_id
    closes = period_gate.grant_late_delivery(
        ledger,
        settings.policy,
        period,
        clock.now(),
        request.operator,
        f"{request.reason} (Dagster run {run_id})",
    )
    context.log.warning(
        f"period {period}: late delivery granted by {request.operator} "
        f"until {closes:%Y-%m-%d %H:%M} UTC"
    )
