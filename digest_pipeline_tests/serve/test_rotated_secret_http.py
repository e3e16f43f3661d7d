"""After a rotation, `digest serve` honours links the rotated-out secret signed, until the overlap ends.

The application is configured as `digest serve` configures it (`serve_secrets` over the ledger's
record): a link signed with the previous secret unsubscribes during the overlap and is 403 from
its end on, while links signed with the new secret keep working.
"""

from collections.abc import Callable
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore, concurrent_callers
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.compliance import Compliance
from digest_pipeline.domain.unsubscribe import unsubscribe_token
from digest_pipeline.serve.app import ServeConfig, build_app
from digest_pipeline.serve.server import BackgroundServer
from digest_pipeline.services.link_secrets import require_secret, rotate_secret, serve_secrets
from digest_pipeline_tests.builders import SHOP_POSTAL_ADDRESS, SHOP_UNSUBSCRIBE_URL
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.serve.conftest import ONE_CLICK, ONE_CLICK_BODY, SECRET, deliver_week

OLD = "the-secret-before-the-rotation"
OVERLAP = timedelta(weeks=8)


def _link(secret: str, n: int) -> str:
    customer_id = f"customer-{n:04d}"
    return f"/unsubscribe/{customer_id}?token={unsubscribe_token(secret, customer_id)}"


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_links_of_the_rotated_out_secret_work_only_during_the_overlap(
    backend: str, sql_engine_factory: Callable[[str], Engine]
):
    engine, clock = sql_engine_factory(backend), FixedClock(T0)
    deliver_week(engine, clock, 4, unknown=())
    ledger = SqlLedger(engine)
    require_secret(ledger, OLD, clock.now(), what="digest run")  # the week's links were OLD's
    rotate_secret(ledger, SECRET, OLD, OVERLAP, clock.now(), actor="alice", reason="yearly")
    shop = Compliance(SHOP_UNSUBSCRIBE_URL, SHOP_POSTAL_ADDRESS)
    secrets = serve_secrets(ledger, SECRET, OLD, clock.now(), compliance=shop)
    app = build_app(
        config=ServeConfig(
            unsubscribe_secret=secrets.current,
            previous_unsubscribe_secret=secrets.previous,
            previous_secret_until=secrets.previous_until,
            ledger_threads=concurrent_callers(engine),
        ),
        store=SqlFeedbackStore(engine),
        ledger=ledger,
        queue=ledger,
        clock=clock,
    )
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url) as http:

        def post(path: str) -> int:
            return http.post(path, content=ONE_CLICK_BODY, headers=ONE_CLICK).status_code

        during = (post(_link(OLD, 1)), http.get(_link(OLD, 2)).status_code)
        clock.advance(OVERLAP)
        after = (post(_link(OLD, 2)), http.get(_link(OLD, 2)).status_code, post(_link(SECRET, 3)))

    assert during == (200, 200)
    assert after == (403, 403, 200)
    suppressed = [s.customer_id for s in SqlFeedbackStore(engine).suppressions()]
    assert suppressed == ["customer-0001", "customer-0003"]
