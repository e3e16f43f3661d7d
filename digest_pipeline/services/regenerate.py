"""Regenerate the digest rows of a period's never-sent items from the current catalogue.

After a bad catalogue row is fixed, the items that failed on it still hold the rows frozen with
it. This replaces the rows of every item that was never sent (`REGENERABLE`) whose rows differ
from what the catalogue gives now; the ledger's compare-and-set on state refuses any item that
was claimed, sent or went `unknown` meanwhile. It changes no state: `failed` and `dead_lettered`
keys then go through `digest replay` (reconciliation first), pending and retrying ones go out on
their next attempt. One audit row per run, written before any row changes, names who and why.
"""

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from digest_pipeline.domain.catalogue import PicksRule, ProductProblem, popular_in_your_categories
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.model import AuditEntry, DigestRow
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.regeneration import REGENERABLE, RegenerateRefused
from digest_pipeline.domain.states import REPLAYABLE, DeliveryState
from digest_pipeline.ports.ledger_roles import AuditTrail, ContentStore, ReadModel
from digest_pipeline.ports.outside import Clock, CustomerSource
from digest_pipeline.services.content import LOOKBACK, plan_content
from digest_pipeline.services.logs import step_log

#: keys per read-pick-replace round: one ledger transaction each
CHUNK = 500
#: keys that need a replay listed in the report (the count is always complete)
SAMPLE = 100


class RegenerateLedger(ReadModel, ContentStore, AuditTrail, Protocol):
    """The never-sent items, their rows replaced under the ledger's guard, and the run's audit row."""


@dataclass(frozen=True)
class RegenerateReport:
    """What a regeneration did (or, with `dry_run`, would do) in one period."""

    period: Period
    dry_run: bool
    #: never-sent items looked at, by state
    considered: dict[DeliveryState, int]
    #: items whose rows were (or would be) replaced
    regenerated: int
    #: items whose rows already are what the current catalogue gives: left alone
    unchanged: int
    #: items the ledger refused because they were claimed, sent or went unknown meanwhile
    changed_meanwhile: int
    #: rows written
    rows: int
    #: regenerated items the catalogue offers nothing now (their digests will fail to render)
    without_picks: int
    #: the catalogue's products left out of every pick, by id and field
    excluded: tuple[ProductProblem, ...]
    #: regenerated items that are failed or dead-lettered: they need `digest replay`
    to_replay: int
    #: the first `SAMPLE` of them, in key order
    to_replay_sample: tuple[OperationKey, ...]


def _same(old: Sequence[DigestRow], new: Sequence[DigestRow]) -> bool:
    def shape(rows: Sequence[DigestRow]) -> list[tuple[int, dict[str, object]]]:
        return [(r.position, r.payload) for r in sorted(rows, key=lambda r: r.position)]

    return shape(old) == shape(new)


def regenerate_period(
    source: CustomerSource,
    ledger: RegenerateLedger,
    clock: Clock,
    period: Period,
    *,
    operator: str,
    reason: str,
    dry_run: bool,
    picks_per_customer: int = 4,
    lookback: timedelta = LOOKBACK,
    chunk: int = CHUNK,
    picks_rule: PicksRule = popular_in_your_categories,
) -> RegenerateReport:
    """Regenerates the rows of `period`'s never-sent items whose content changed.

    Raises:
        RegenerateRefused: no operator or no reason was given; nothing changed.
        ValueError: `picks_per_customer` or `chunk` is below 1 or `lookback` is not positive.
    """
    operator, reason = operator.strip(), " ".join(reason.split())
    if not operator or not reason:
        raise RegenerateRefused("a regeneration needs an operator and a reason")
    if picks_per_customer < 1 or chunk < 1:
        raise ValueError("picks_per_customer and chunk must be at least 1")
    content = plan_content(source, period, lookback, picks_rule)
    counts = {s: n for s, n in ledger.state_counts(period).items() if s in REGENERABLE and n}
    if counts and not dry_run:
        states = ", ".join(f"{s.value} {n}" for s, n in sorted(counts.items()))
        ledger.record_audit(
            AuditEntry(
                clock.now(),
                operator,
                "regenerate",
                None,
                None,
                None,
                f"{reason} (never-sent items: {states}; catalogue excludes "
                f"{len(content.excluded)} product(s))",
                period,
            )
        )
    considered: Counter[DeliveryState] = Counter()
    regenerated = unchanged = meanwhile = rows = empty = replay = 0
    sample: list[OperationKey] = []
    for items in chunked(ledger.iter_items(period, REGENERABLE, page=chunk), chunk):
        considered.update(i.state for i in items)
        state = {i.key: i.state for i in items}
        new = content.content_of(source, list(state), picks_per_customer)
        by_key: defaultdict[OperationKey, list[DigestRow]] = defaultdict(list)
        for r in new.rows:
            by_key[r.key].append(r)
        old = ledger.digest_rows_of(list(state))
        # a customer the rule failed keeps the rows they have: a broken rule never empties a
        # digest that was good (its line, by key, says which)
        failed = set(new.rule_failed)
        changed = [k for k in state if k not in failed and not _same(old[k], by_key[k])]
        unchanged += len(state) - len(changed)
        if dry_run:
            done: Sequence[OperationKey] = changed
            rows += sum(len(by_key[k]) for k in changed)
        else:
            result = ledger.replace_digest_rows(changed, [r for k in changed for r in by_key[k]])
            done = [k for k in changed if k in result.replaced]
            meanwhile += len(result.refused)
            rows += result.written
        regenerated += len(done)
        empty += sum(1 for k in done if not by_key[k])
        needs_replay = [k for k in done if state[k] in REPLAYABLE]
        replay += len(needs_replay)
        sample.extend(needs_replay[: SAMPLE - len(sample)])
    report = RegenerateReport(
        period,
        dry_run,
        dict(considered),
        regenerated,
        unchanged,
        meanwhile,
        rows,
        empty,
        content.excluded,
        replay,
        tuple(sample),
    )
    step_log.info(
        "regenerated",
        period=period,
        dry_run=dry_run,
        regenerated=regenerated,
        unchanged=unchanged,
        changed_meanwhile=meanwhile,
        rows=rows,
        to_replay=replay,
        operator=operator,
    )
    return report
