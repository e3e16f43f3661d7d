"""Failure classes and the outcome of one attempt."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome


@pytest.mark.parametrize("failure_class", list(FailureClass), ids=lambda f: f.name)
def test_failure_class_value_is_its_lower_case_name(failure_class):
    assert failure_class.value == failure_class.name.lower()


def test_failure_classes_are_exactly_the_designs_four():
    assert {f.value for f in FailureClass} == {"transient", "throttled", "permanent", "unknown"}


# --- SendOutcome.sent -----------------------------------------------------------------------


def test_sent_outcome_is_accepted():
    assert SendOutcome.sent("msg-1").accepted


def test_sent_outcome_has_no_failure_class():
    assert SendOutcome.sent("msg-1").failure_class is None


def test_sent_outcome_keeps_the_provider_message_id():
    assert SendOutcome.sent("msg-1").provider_message_id == "msg-1"


def test_sent_outcome_may_lack_a_provider_message_id():
    assert SendOutcome.sent(None).provider_message_id is None


def test_sent_outcome_is_not_a_duplicate_by_default():
    assert not SendOutcome.sent("msg-1").duplicate


def test_sent_outcome_records_a_provider_detected_duplicate():
    assert SendOutcome.sent("msg-1", duplicate=True).duplicate


def test_sent_outcome_label_is_sent():
    assert SendOutcome.sent("msg-1").label == "sent"


# --- SendOutcome.failed ---------------------------------------------------------------------


@pytest.mark.parametrize("failure_class", list(FailureClass), ids=lambda f: f.name)
def test_failed_outcome_is_not_accepted(failure_class):
    assert not SendOutcome.failed(failure_class, "smtp:451").accepted


@pytest.mark.parametrize("failure_class", list(FailureClass), ids=lambda f: f.name)
def test_failed_outcome_label_is_the_failure_class_value(failure_class):
    assert SendOutcome.failed(failure_class, "smtp:451").label == failure_class.value


def test_failed_outcome_keeps_its_detail():
    assert SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451").detail == "smtp:451"


def test_failed_outcome_has_no_provider_message_id():
    assert SendOutcome.failed(FailureClass.TRANSIENT, "http:503").provider_message_id is None


def test_failed_outcome_keeps_the_providers_retry_after():
    outcome = SendOutcome.failed(
        FailureClass.THROTTLED, "http:429", retry_after=timedelta(seconds=90)
    )
    assert outcome.retry_after == timedelta(seconds=90)


def test_failed_outcome_has_no_retry_after_by_default():
    assert SendOutcome.failed(FailureClass.THROTTLED, "http:429").retry_after is None


# --- the invariant: accepted xor failure class ----------------------------------------------


def test_outcome_both_accepted_and_failed_is_rejected():
    with pytest.raises(ValueError, match="either accepted or has a failure class"):
        SendOutcome(accepted=True, failure_class=FailureClass.TRANSIENT)


def test_outcome_neither_accepted_nor_failed_is_rejected():
    with pytest.raises(ValueError, match="either accepted or has a failure class"):
        SendOutcome(accepted=False, failure_class=None)
