"""An ambiguous send is never sent twice, and each mailer's own evidence settles it.

Through the real delivery path (a SQLite ledger, `deliver_due`, the sweep, the reconciler) and
every mailer's real peer: the peer takes the message and the answer is lost, so the item is
`unknown`. Whatever a scheduler or an operator runs later, the peer still holds exactly one
message for the key; a mailer that can prove the send (a lookup, an idempotent resend) ends the
item `sent`, one that cannot leaves it `unknown` until its evidence arrives: SendGrid's signed
`delivered` event through `digest serve`'s application, an operator's resolution for SMTP.
"""

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.retry import retry_delay_bound
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.pipeline import sweep
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline_tests.builders import failed_invariants, seed_period, state_of
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.contract.all_mailer_rigs import RIGS
from digest_pipeline_tests.contract.mailer_rigs import Fault, MailerRig, World

#: past every mailer's lookup lag (Postmark's 5 minutes), inside the idempotency window and the
#: period's delivery window
LATER = timedelta(minutes=10)


@pytest.fixture(params=list(RIGS))
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MailerRig]:
    with RIGS[request.param](tmp_path) as opened:
        yield opened


@pytest.fixture
def world(sql_engine_factory: Callable[[str], Engine]) -> World:
    return World(sql_engine_factory("sqlite"))


def lose_the_answer(rig: MailerRig, world: World) -> list[OperationKey]:
    """Two customers delivered; the peer took the first one's message and its answer was lost."""
    keys = seed_period(world.ledger, 2, now=world.clock.now())
    rig.script(keys[0], Fault.ANSWER_LOST)
    report = world.deliver(rig.mailer())
    assert report.outcomes == {"sent": 1, "unknown": 1}
    assert state_of(world.ledger, keys[0]) is DeliveryState.UNKNOWN
    assert [rig.held(k) for k in keys] == [1, 1]
    return keys


def test_an_ambiguous_send_is_never_sent_again_whatever_runs_later(rig, world):
    keys = lose_the_answer(rig, world)
    lost, mailer = keys[0], rig.mailer()
    assert rig.mailer().capabilities.lookup_lag < LATER

    # the scheduler's next delivery run, once a retry of the attempt would be due
    world.clock.advance(retry_delay_bound(1, world.policy.retry))
    world.deliver(mailer)
    # the operator's sweep at 3 a.m., then the reconciler and one more delivery run
    world.clock.advance(LATER)
    sweep(world.deliverer(mailer), batch_size=10, concurrency=1)
    reconcile_period(world.ledger, mailer, world.clock, world.policy, W42)
    world.deliver(mailer)

    assert [rig.held(k) for k in keys] == [1, 1]
    item = world.ledger.get(lost)
    assert item is not None
    if rig.proves_send:
        # proven by the reconciler inside the sweep, which then cleaned it
        assert item.state is DeliveryState.CLEANED
    else:
        # never "not sent", never sent again: still waiting for its evidence
        assert item.state is DeliveryState.UNKNOWN
        assert [a.outcome for a in world.ledger.attempts(lost)] == ["unknown"]
    assert failed_invariants(world.ledger, W42, world.clock.now()) == []


def test_the_mailers_own_evidence_settles_an_ambiguous_send(rig, world):
    keys = lose_the_answer(rig, world)
    lost = keys[0]
    world.clock.advance(LATER)

    assert rig.settle(world, lost) == rig.evidence

    item = world.ledger.get(lost)
    assert item is not None
    assert item.state is DeliveryState.SENT
    if (first := rig.message_id(lost)) is not None:
        # the id the peer gave the message it took before the answer was lost
        assert item.provider_message_id == first
    sweep(world.deliverer(rig.mailer()), batch_size=10, concurrency=1)
    assert state_of(world.ledger, lost) is DeliveryState.CLEANED
    assert [rig.held(k) for k in keys] == [1, 1]
    assert failed_invariants(world.ledger, W42, world.clock.now()) == []
