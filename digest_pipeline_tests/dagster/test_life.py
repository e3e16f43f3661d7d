"""Eight weeks of the shop's life on virtual time, through the project's own Definitions.

Each week: the shop changes (opt-outs, customers going inactive, new addresses, sign-ups, a week
of orders and a new product), `weekly_digest_schedule` ticks on Monday 06:00 UTC and its one
request runs `weekly_digest_job`; the provider (a `FakeMailer`: scripted faults per key, and the
record of every message it delivered) fails some sends transiently, throttles some, times out
after accepting some (ambiguous: `unknown`) and times out before accepting others; then
`digest_retry_sweeper` ticks on a widening cadence and its requests run until it has nothing new
to ask for. One week is re-materialised whole by an operator after it was delivered. Both SQL
backends run the same life.

What is asserted, for every week, once its sweeps are quiet:

* every run succeeded and every ERROR-severity asset check of every run passed, for its partition;
* `Ledger.check_invariants` holds for every week so far, at the current virtual time;
* the frozen snapshot is exactly the shop's active, opted-in customers with their addresses at
  the schedule tick (so who opted out, went inactive or signed up since last week, and every new
  address, shows), and no earlier week's snapshot has changed;
* every selected customer's item is in the state its script implies (`cleaned`; `failed` for an
  address the composer refuses; `dead_lettered` `max_attempts` for a send that always fails;
  `unknown` for the ambiguous send no evidence settles, later `dead_lettered`
  `unknown_unresolved`), with exactly the scripted number of attempts and provider calls;
* the provider delivered no key twice, and every delivered message went to the address frozen
  for its key (also for a customer who moved or left while their digest was still retrying);
* the totals add up: eligible = snapshot entries = work items = sum of items by state;
  messages the provider delivered for the week = items cleaned + ambiguous items left `unknown`
  (or dead-lettered `unknown_unresolved`) whose send the provider had in fact accepted;
  provider calls = attempts - attempts refused by the composer before any call; attempts the
  provider answered as a duplicate of its key = the scripted accepted-then-timeout sends that
  reconciliation resent inside the provider's idempotency window;
* the operator's re-materialisation sends nothing: no provider call, no attempt, no state change.

The per-week totals are printed (visible with `pytest -s`) and written to `life-<backend>.txt`
in the test's temporary directory.
"""

import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline.component.resources import DeliveryResource
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.conftest import SQL_BACKENDS
from digest_pipeline_tests.dagster.life import (
    Launch,
    Life,
    Shop,
    is_plain_address,
    schedule_tick_of,
)
from digest_pipeline_tests.dagster.life_book import (
    CUSTOMERS,
    INVARIANT_CHECKS,
    MAX_ATTEMPTS,
    PLAN,
    SEED,
    SWEEP_GAPS,
    UNKNOWN_RETENTION,
    WEEKS,
    Book,
    Changes,
    Role,
    Week,
    expected_for,
    script,
)
from digest_pipeline_tests.fakes import FixedClock

# -- the life ----------------------------------------------------------------------------------


@pytest.fixture
def persistent_instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    # schedule and sensor contexts refuse an ephemeral instance
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield instance


# eight weeks of real runs: well under a minute alone, several on a loaded 2-core machine
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_eight_weeks_of_schedule_and_sweeper_deliver_every_digest_at_most_once(
    backend, sql_engine_factory, persistent_instance, tmp_path
):
    engine = sql_engine_factory(backend)
    start = schedule_tick_of(WEEKS[0]) - timedelta(hours=1)
    shop = Shop(engine, customers=CUSTOMERS, seed=SEED, now=start)
    delivery = DeliveryResource(batch_size=25, concurrency=4, retry_max_attempts=MAX_ATTEMPTS)
    life = Life(persistent_instance, engine, FixedClock(start), tmp_path, delivery)
    book = Book()

    for n, (period, week) in enumerate(zip(WEEKS, PLAN, strict=True)):
        changes = change_the_shop(shop, week, n, book, previous=WEEKS[n - 1] if n else None)
        live_week(life, shop, book, period, week, changes, n)

    # the end of the life: every week once more, as it stands now
    for period in WEEKS:
        assert_week(life, book, period)
    table = render(book.rows, life, backend)
    (tmp_path / f"life-{backend}.txt").write_text(table, encoding="utf-8")
    sys.stdout.write(f"\n{table}\n")


def change_the_shop(shop: Shop, week: Week, n: int, book: Book, previous: Period | None) -> Changes:
    """The shop's week before the tick: orders, a new product, and customers changing."""
    changes = Changes()
    if previous is None:
        return changes
    shop.trade(previous)
    taken = {cid for (_, cid) in book.moved_mid_week}
    plain = [
        cid
        for cid, email in shop.eligible().items()
        if is_plain_address(email) and cid not in taken
    ]
    picks = iter(rotated(plain, 11 * n))
    for _ in range(week.opt_out):
        cid = next(picks)
        shop.change(cid, opted_in=False)
        changes.left.add(cid)
    for _ in range(week.deactivate):
        cid = next(picks)
        shop.change(cid, active=False)
        changes.left.add(cid)
    for _ in range(week.readdress):
        cid = next(picks)
        email = f"moved.{n}.{cid.replace('-', '')}@example.org"
        shop.change(cid, email=email)
        changes.readdressed[cid] = email
    sleepers = sorted(c for c, p in shop.people.items() if p.active and not p.opted_in)
    for cid in sleepers[: week.opt_in]:
        shop.change(cid, opted_in=True)
        changes.joined.add(cid)
    for i in range(week.sign_up):
        cid = f"customer-9{n}{i:02d}"
        shop.sign_up(
            cid, f"new.{n}.{i}@example.net", schedule_tick_of(previous) + timedelta(days=2)
        )
        changes.joined.add(cid)
    typos = sorted(c for c, e in shop.eligible().items() if not is_plain_address(e))
    for cid in typos[: week.fix_invalid]:
        email = f"fixed.{cid.replace('-', '')}@example.com"
        shop.change(cid, email=email)
        changes.readdressed[cid] = email
    return changes


def rotated(items: Sequence[str], by: int) -> list[str]:
    if not items:
        return []
    k = by % len(items)
    return [*items[k:], *items[:k]]


def assign_roles(week: Week, eligible: dict[str, str], n: int) -> dict[str, tuple[Role, int]]:
    """Role and scripted failure count per selected customer, drawn from the valid addresses."""
    roles = {
        cid: ((Role.PLAIN, 0) if is_plain_address(email) else (Role.INVALID, 0))
        for cid, email in eligible.items()
    }
    pool = iter(rotated([c for c, (r, _) in roles.items() if r is Role.PLAIN], 7 * n + 3))
    wanted = [
        *((Role.TRANSIENT, k) for k in week.transient),
        *((Role.THROTTLED, 0),) * week.throttled,
        *((Role.EXHAUSTED, 0),) * week.exhausted,
        *((Role.ACCEPTED_TIMEOUT, 0),) * week.accepted_timeout,
        *((Role.LOST_TIMEOUT, 0),) * week.lost_timeout,
        *((Role.STUCK_UNKNOWN, 0),) * week.stuck_unknown,
    ]
    for role in wanted:
        roles[next(pool)] = role
    return roles


def live_week(
    life: Life, shop: Shop, book: Book, period: Period, week: Week, changes: Changes, n: int
) -> None:
    tick = schedule_tick_of(period)
    eligible = shop.eligible()
    roles = assign_roles(week, eligible, n)
    for cid, (role, failures) in roles.items():
        key = OperationKey(period, cid)
        script(life.mailer, key, role, failures)
        book.expected[key] = expected_for(role, failures)

    assert life.clock.now() <= tick
    life.clock.set(tick)
    scheduled = life.schedule_tick()
    assert scheduled.partition_key == period.partition_key
    assert scheduled.run_key == period.partition_key
    assert scheduled.metadata("eligibility_snapshot")["this_run_froze"] is True
    assert scheduled.metadata("digest_work_items")["this_run_created"] == len(eligible)

    frozen = {e.customer_id: e.recipient for e in life.ledger.snapshot_entries(period)}
    assert frozen == eligible
    info = life.ledger.snapshot(period)
    assert info is not None
    assert (info.selection_run_id, info.selected_at) == (scheduled.result.run_id, tick)
    assert_changes_show(book, period, frozen, changes, n)
    book.frozen[period] = frozen
    move_retrying_customers(life, shop, book, period, week, roles, n)

    sweeps = life.sweep(SWEEP_GAPS)
    operator = rematerialise(life, period) if week.rematerialise else None
    assert_week(life, book, period)
    for earlier in WEEKS[:n]:
        assert_week(life, book, earlier)
    book.rows.append(totals(life, book, period, scheduled, sweeps, operator, changes))


def assert_changes_show(
    book: Book, period: Period, frozen: dict[str, str], changes: Changes, n: int
) -> None:
    """Who left is gone, who joined is in, a new address is used; last week's snapshot is as was."""
    if n == 0:
        return
    before = book.frozen[WEEKS[n - 1]]
    for cid in changes.left:
        assert cid in before, cid
        assert cid not in frozen, cid
    for cid in changes.joined:
        assert cid not in before, cid
        assert cid in frozen, cid
    for cid, email in changes.readdressed.items():
        assert before[cid] != email
        assert frozen[cid] == email
    for (p, cid), what in book.moved_mid_week.items():
        if p == WEEKS[n - 1]:
            if what == "left":
                assert cid not in frozen, cid
            else:
                assert frozen[cid] == what, cid


def move_retrying_customers(
    life: Life,
    shop: Shop,
    book: Book,
    period: Period,
    week: Week,
    roles: dict[str, tuple[Role, int]],
    n: int,
) -> None:
    """After the freeze: customers whose digest is still retrying move house or leave."""
    retrying = sorted(cid for cid, (r, k) in roles.items() if r is Role.TRANSIENT and k >= 1)
    waiting = {i.customer_id for i in life.ledger.items(period, [DeliveryState.RETRY_SCHEDULED])}
    assert set(retrying) <= waiting, "they change while their digest is still retrying"
    for cid in retrying[: week.readdress_retrying]:
        email = f"midweek.{n}.{cid.replace('-', '')}@example.com"
        shop.change(cid, email=email)
        book.moved_mid_week[(period, cid)] = email
    for cid in retrying[week.readdress_retrying :][: week.deactivate_retrying]:
        shop.change(cid, active=False)
        book.moved_mid_week[(period, cid)] = "left"


def rematerialise(life: Life, period: Period) -> Launch:
    """The operator runs the whole delivered week again: nothing may be sent or changed."""
    life.clock.set(max(life.clock.now(), schedule_tick_of(period) + timedelta(days=2)))
    assert life.clock.now() < period.ends_at + timedelta(days=7), "inside the delivery window"
    deliveries, sends = life.mailer.deliveries, life.mailer.sends
    items = life.ledger.items(period)
    attempts = life.ledger.attempt_outcome_counts(period)

    launch = life.operator_rematerialise(period)

    assert (life.mailer.deliveries, life.mailer.sends) == (deliveries, sends)
    assert life.ledger.items(period) == items
    assert life.ledger.attempt_outcome_counts(period) == attempts
    assert launch.metadata("eligibility_snapshot")["this_run_froze"] is False
    assert launch.metadata("digest_content")["this_run_rows"] == 0
    assert launch.metadata("digest_work_items")["this_run_created"] == 0
    deliveries_md = launch.metadata("digest_deliveries")
    assert (deliveries_md["this_run_claimed"], deliveries_md["this_run_sent"]) == (0, 0)
    assert launch.metadata("digest_cleanup")["this_run_cleaned"] == 0
    return launch


# -- the assertions of one week ------------------------------------------------------------------


def assert_week(life: Life, book: Book, period: Period) -> None:
    now = life.clock.now()
    ledger = life.ledger
    expected = book.of(period)
    frozen = book.frozen[period]

    # the snapshot, frozen once
    assert {e.customer_id: e.recipient for e in ledger.snapshot_entries(period)} == frozen
    assert {k.customer_id for k in expected} == set(frozen)
    # the invariants, as the ledger evaluates them
    failing = [r for r in ledger.check_invariants(period, now) if not r.passed]
    assert not failing, failing
    # every run of the week, and every check evaluation in it
    for launch in life.launches:
        if launch.partition_key == period.partition_key:
            assert_run(launch)

    items = {i.key: i for i in ledger.items(period)}
    assert set(items) == set(expected)
    record = life.mailer.deliveries  # one read, under the provider's lock
    delivered = Counter(key for key, _, _ in record)
    recipients = {key: m.recipient for key, _, m in record}
    assert max(delivered.values(), default=0) <= 1, "a key delivered twice"
    dead_letters = Counter(d.reason for d in ledger.dead_letters(period))
    want_dead_letters: Counter[str] = Counter()
    for key, want in expected.items():
        item = items[key]
        state = stuck_state(life, item.last_attempt_at) if want.role is Role.STUCK_UNKNOWN else None
        assert item.state is (state or want.state), (key, want.role, item.state, item.last_detail)
        assert delivered[str(key)] == want.deliveries, (key, want.role)
        attempts = len(ledger.attempts(key))
        sends = life.mailer.sends_for(key)
        if want.role is Role.STUCK_UNKNOWN:
            assert sends == attempts >= 2, (key, sends, attempts)
            assert key in ledger.keys_with_rows(period), "an unsettled item keeps its rows"
            if state is DeliveryState.DEAD_LETTERED:
                want_dead_letters["unknown_unresolved"] += 1
        else:
            assert (attempts, sends) == (want.attempts, want.sends), (key, want.role)
        if want.dead_letter is not None:
            want_dead_letters[want.dead_letter] += 1
        if delivered[str(key)]:
            assert recipients[str(key)] == frozen[key.customer_id], "sent to the frozen address"
    assert dead_letters == want_dead_letters


def stuck_state(life: Life, last_attempt_at) -> DeliveryState:
    """`unknown` until a sweeper tick finds its retention over, then `dead_lettered`."""
    assert last_attempt_at is not None
    expired = any(t >= last_attempt_at + UNKNOWN_RETENTION for t in life.sensor_ticks)
    return DeliveryState.DEAD_LETTERED if expired else DeliveryState.UNKNOWN


def assert_run(launch: Launch) -> None:
    assert launch.result.success, (launch.trigger, launch.partition_key, launch.failures)
    evaluations = launch.checks
    assert evaluations, "the run evaluated no asset check"
    names = {e.check_name for e in evaluations}
    if launch.trigger != "sweep":
        assert names >= INVARIANT_CHECKS, names
    for e in evaluations:
        assert e.partition == launch.partition_key, e
        if e.severity is dg.AssetCheckSeverity.ERROR:
            assert e.passed, (launch.trigger, launch.partition_key, e.check_name, e.metadata)


# -- the totals ----------------------------------------------------------------------------------


def totals(
    life: Life,
    book: Book,
    period: Period,
    scheduled: Launch,
    sweeps: Sequence[Launch],
    operator: Launch | None,
    changes: Changes,
) -> dict[str, object]:
    """One row of the table, with the sums it states asserted."""
    ledger = life.ledger
    counts = ledger.state_counts(period)
    eligible = len(book.frozen[period])
    info = ledger.snapshot(period)
    assert info is not None
    assert sum(counts.values()) == eligible == info.eligible_count == len(ledger.items(period))
    keys = [str(k) for k in book.of(period)]
    delivered = life.delivered()
    messages = sum(delivered[k] for k in keys)
    # ambiguous sends the provider had accepted but no evidence settled: `unknown`, or
    # dead-lettered `unknown_unresolved` once their retention ran out
    unsettled = {str(i.key) for i in ledger.items(period, [DeliveryState.UNKNOWN])} | {
        str(d.key) for d in ledger.dead_letters(period) if d.reason == "unknown_unresolved"
    }
    unsettled_but_accepted = sum(delivered[k] for k in unsettled)
    assert messages == counts.get(DeliveryState.CLEANED, 0) + unsettled_but_accepted
    outcomes = ledger.attempt_outcome_counts(period)
    attempts = sum(v for k, v in outcomes.items() if k != "duplicate")
    sends = sum(life.mailer.sends_for(k) for k in keys)
    invalid = sum(1 for e in book.of(period).values() if e.role is Role.INVALID)
    assert sends == attempts - invalid
    accepted_timeouts = sum(1 for e in book.of(period).values() if e.role is Role.ACCEPTED_TIMEOUT)
    assert outcomes.get("duplicate", 0) == accepted_timeouts
    runs = [scheduled, *sweeps, *([operator] if operator else [])]
    evaluations = [e for r in runs for e in r.checks]
    warned = sorted(
        {
            e.check_name
            for e in evaluations
            if e.severity is dg.AssetCheckSeverity.WARN and not e.passed
        }
    )
    return {
        "week": str(period),
        "shop": changes.summary(),
        "mid_week": sum(1 for p, _ in book.moved_mid_week if p == period),
        "eligible": eligible,
        **{
            s.value: counts.get(s, 0)
            for s in (
                DeliveryState.CLEANED,
                DeliveryState.FAILED,
                DeliveryState.DEAD_LETTERED,
                DeliveryState.UNKNOWN,
            )
        },
        "messages": messages,
        "sends": sends,
        "attempts": attempts,
        "dup_ack": outcomes.get("duplicate", 0),
        "runs": f"1+{len(sweeps)}" + ("+op" if operator else ""),
        "checks": f"{sum(e.passed for e in evaluations)}/{len(evaluations)}",
        "warn": ",".join(warned) or "-",
    }


def render(rows: Sequence[dict[str, object]], life: Life, backend: str) -> str:
    headers = list(rows[0])
    cells = [[str(r[h]) for h in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True))

    end = ", ".join(
        f"{p}: "
        + " ".join(f"{s.value}={n}" for s, n in sorted(life.ledger.state_counts(p).items()))
        for p in WEEKS
    )
    return "\n".join(
        [
            f"life on {backend}: {len(WEEKS)} weeks, {len(life.launches)} runs, "
            f"{life.deduplicated} sweeper request(s) with an already-run key not launched",
            line(headers),
            *(line(c) for c in cells),
            f"at the end: {end}",
            f"provider: {life.mailer.sends} calls, {len(life.mailer.deliveries)} messages, "
            f"{life.mailer.suppressed_duplicates} duplicate(s) suppressed by key, "
            f"{life.mailer.duplicate_deliveries} delivered twice",
        ]
    )
