import email
import email.policy
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.adapters.mail.outbox import (
    KEY_HEADER_MISMATCH,
    NAME_HOLDS_OTHER_KEY,
    OutboxMailer,
    file_name,
    legacy_file_name,
    stored_key,
)
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


UPPER = OperationKey(W42, "CUSTOMER-0002")
LOWER = OperationKey(W42, "customer-0002")


def test_keys_differing_only_in_letter_case_get_names_that_differ_in_any_case():
    upper, lower = file_name(UPPER), file_name(LOWER)

    assert upper.lower() != lower.lower()
    assert lower == "digest_2026-W42_customer-0002.eml"  # an all-lower-case id keeps its name
    assert upper == "digest_2026-W42_+c+u+s+t+o+m+e+r-0002.eml"


def test_a_file_under_the_name_holding_another_key_is_not_taken_as_delivered(tmp_path):
    # What a case-insensitive disk shows: the key's exact path already holds another key's file.
    outbox = OutboxMailer(tmp_path)
    (tmp_path / "new").mkdir()
    squatter = tmp_path / "new" / file_name(UPPER)
    squatter.write_bytes(to_bytes(message(LOWER)))

    outcome = outbox.send(message(UPPER), idempotency_key=str(UPPER))

    assert not outcome.accepted
    assert (outcome.failure_class, outcome.detail) == (FailureClass.PERMANENT, NAME_HOLDS_OTHER_KEY)
    assert outbox.lookup(str(UPPER)).status is LookupStatus.NOT_FOUND
    assert [stored_key(p) for p in outbox.stored()] == [str(LOWER)]


def test_another_writer_linking_another_key_first_is_not_a_duplicate(tmp_path, monkeypatch):
    # The race: the name is free when checked, and another key's file is linked before ours.
    outbox = OutboxMailer(tmp_path)
    real_link = os.link

    def link_after_another_writer(src, dst):
        Path(dst).write_bytes(to_bytes(message(LOWER)))
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_another_writer)
    outcome = outbox.send(message(UPPER), idempotency_key=str(UPPER))

    assert (outcome.failure_class, outcome.detail) == (FailureClass.PERMANENT, NAME_HOLDS_OTHER_KEY)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_older_outboxs_case_collision_neither_delivers_nor_blocks_the_key(tmp_path):
    # Before the escaping, CUSTOMER-0002's name on a case-insensitive disk was customer-0002's
    # file: the older name holding another key is that key's delivery, not this one's.
    outbox = OutboxMailer(tmp_path)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / legacy_file_name(UPPER)).write_bytes(to_bytes(message(LOWER)))

    assert outbox.lookup(str(UPPER)).status is LookupStatus.NOT_FOUND
    outcome = outbox.send(message(UPPER), idempotency_key=str(UPPER))

    assert outcome.accepted
    assert not outcome.duplicate
    assert stored_key(tmp_path / "new" / file_name(UPPER)) == str(UPPER)


def test_an_older_outboxs_file_for_the_key_is_still_found_and_never_written_twice(tmp_path):
    outbox = OutboxMailer(tmp_path)
    (tmp_path / "cur").mkdir()
    (tmp_path / "cur" / legacy_file_name(UPPER)).write_bytes(to_bytes(message(UPPER)))

    found = outbox.lookup(str(UPPER))
    again = outbox.send(message(UPPER), idempotency_key=str(UPPER))

    assert (found.status, found.provider_message_id) == (LookupStatus.FOUND, message_id_for(UPPER))
    assert again.accepted
    assert again.duplicate
    assert len(outbox.stored()) == 1


def test_every_stored_file_names_its_own_key(tmp_path):
    outbox = OutboxMailer(tmp_path)
    bare = Message(KEY, "shopper@example.test", "digest@example.com", "Your picks", "picks\n")
    lying = replace(bare, key=UPPER, headers=(("X-Digest-Operation-Key", str(KEY)),))

    assert outbox.send(bare, idempotency_key=str(KEY)).accepted
    refused = outbox.send(lying, idempotency_key=str(UPPER))

    assert [stored_key(p) for p in outbox.stored()] == [str(KEY)]
    assert (refused.failure_class, refused.detail) == (FailureClass.PERMANENT, KEY_HEADER_MISMATCH)
