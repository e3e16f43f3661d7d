"""A whole period through the real pieces: SQL ledger, Jinja2 composer, outbox Maildir.

What a receiving system sees is checked from the files themselves: one message per selected
customer, each carrying its operation key, a stable Message-ID and a one-click unsubscribe link.
"""

import email
import email.policy

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.render import Jinja2Composer, message_id_key
from digest_pipeline.domain.model import CleanupMode, keyed_message_id
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline_tests.builders import email_of, make_deliverer, seed_period
from digest_pipeline_tests.conftest import W42


def test_a_period_delivers_one_real_message_per_customer_and_cleans_up(sql_ledger, clock, tmp_path):
    keys = seed_period(sql_ledger, 12, now=clock.now())
    outbox = OutboxMailer(tmp_path / "outbox")
    composer = Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="test-secret",
        clock=clock,
    )
    deliverer = make_deliverer(sql_ledger, outbox, clock, composer=composer)
    report = deliver_due(deliverer, batch_size=5, concurrency=4)
    assert report.outcomes == {"sent": 12}
    # a re-run sends nothing again
    assert deliver_due(deliverer, batch_size=5, concurrency=4).claimed == 0
    cleanup = clean_period(sql_ledger, clock, W42, CleanupMode.ARCHIVE)
    assert (cleanup.cleaned, cleanup.rows) == (12, 24)

    files = outbox.stored()
    assert len(files) == 12
    for n, key in enumerate(keys, start=1):
        [path] = [p for p in files if str(key).replace(":", "_") in p.name]
        parsed = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        assert parsed["To"] == email_of(n)
        assert parsed["X-Digest-Operation-Key"] == str(key)
        id_key = message_id_key("test-secret")
        assert parsed["Message-ID"] == keyed_message_id(key, id_key, "example.com")
        assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]
    assert {i.state for i in sql_ledger.items(W42)} == {DeliveryState.CLEANED}
    assert all(r.passed for r in sql_ledger.check_invariants(W42, clock.now()))
