import email
import email.policy
import threading

import pytest

from digest_pipeline.adapters.mail.outbox import OutboxMailer, file_name
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import LookupStatus, Message, message_id_for
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline_tests.conftest import W42

KEY = OperationKey(W42, "customer-1842")


def message(
    key: OperationKey = KEY, subject: str = "Your picks", sender: str = "digest@example.com"
) -> Message:
    return Message(
        key=key,
        recipient="shopper@example.test",
        sender=sender,
        subject=subject,
        text="picks\n",
        html="<p>picks</p>",
        headers=(("Message-ID", message_id_for(key)), ("X-Digest-Operation-Key", str(key))),
    )


def test_a_send_stores_one_parseable_file_named_by_the_operation_key(tmp_path):
    outbox = OutboxMailer(tmp_path / "outbox")
    outcome = outbox.send(message(), idempotency_key=str(KEY))
    assert outcome.accepted
    assert not outcome.duplicate
    assert outcome.provider_message_id == message_id_for(KEY)
    [path] = outbox.stored()
    assert path.name == "digest_2026-W42_customer-1842.eml" == file_name(KEY)
    parsed = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
    assert parsed["X-Digest-Operation-Key"] == str(KEY)
    assert parsed.get_content_type() == "multipart/alternative"
    assert list((tmp_path / "outbox" / "tmp").iterdir()) == []


def test_sending_a_key_again_never_writes_a_second_file(tmp_path):
    outbox = OutboxMailer(tmp_path)
    first = outbox.send(message(), idempotency_key=str(KEY))
    again = outbox.send(message(subject="changed"), idempotency_key=str(KEY))
    assert again.accepted
    assert again.duplicate
    assert again.provider_message_id == first.provider_message_id
    assert len(outbox.stored()) == 1


def test_concurrent_writers_of_one_key_leave_exactly_one_file(tmp_path):
    outbox = OutboxMailer(tmp_path)
    outcomes = []
    barrier = threading.Barrier(16)

    def write() -> None:
        barrier.wait()
        outcomes.append(OutboxMailer(tmp_path).send(message(), idempotency_key=str(KEY)))

    threads = [threading.Thread(target=write) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outbox.stored()) == 1
    assert all(o.accepted for o in outcomes)
    assert sum(not o.duplicate for o in outcomes) == 1


def test_a_key_can_be_looked_up_before_and_after_a_reader_moved_it_to_cur(tmp_path):
    outbox = OutboxMailer(tmp_path)
    assert outbox.lookup(str(KEY)).status is LookupStatus.NOT_FOUND
    outbox.send(message(), idempotency_key=str(KEY))
    (tmp_path / "new" / file_name(KEY)).rename(tmp_path / "cur" / file_name(KEY))
    found = outbox.lookup(str(KEY))
    assert (found.status, found.provider_message_id) == (LookupStatus.FOUND, message_id_for(KEY))
    assert outbox.send(message(), idempotency_key=str(KEY)).duplicate
    assert outbox.capabilities.can_lookup


def test_an_unwritable_outbox_is_a_transient_failure_and_stores_nothing(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the Maildir should be", encoding="utf-8")
    outcome = OutboxMailer(blocked).send(message(), idempotency_key=str(KEY))
    assert outcome.failure_class is FailureClass.TRANSIENT
    assert outcome.detail.startswith("outbox:")


def test_a_header_injection_attempt_is_a_permanent_failure(tmp_path):
    outbox = OutboxMailer(tmp_path)
    outcome = outbox.send(message(subject="hi\r\nBcc: x@evil.example"), idempotency_key=str(KEY))
    assert (outcome.failure_class, outcome.detail) == (FailureClass.PERMANENT, "render_error")
    assert outbox.stored() == []


@pytest.mark.parametrize(
    "bad",
    [
        # the email package's parser crashes on these senders (IndexError, AttributeError)
        pytest.param(message(sender="^@"), id="parser-index-error"),
        pytest.param(message(sender="x@["), id="parser-attribute-error"),
        pytest.param(message(subject="hi\u2028Bcc: x@evil.example"), id="unicode-line-break"),
    ],
)
def test_a_message_serialisation_refuses_is_permanent_and_nothing_is_written(tmp_path, bad):
    outbox = OutboxMailer(tmp_path / "outbox")

    outcome = outbox.send(bad, idempotency_key=str(KEY))

    assert (outcome.failure_class, outcome.detail) == (FailureClass.PERMANENT, "render_error")
    assert not (tmp_path / "outbox").exists()
    assert outbox.lookup(str(KEY)).status is LookupStatus.NOT_FOUND
