"""Operation keys carry their digest instance: `vip_digest:2026-W42:customer-1842`.

The default instance keeps the keys every ledger already holds (`digest:…`); any other valid
name survives the trip through the text, and a name that could not prefix a Dagster asset key
or job name is refused in one line. A provider event echoes the key (header or tag) with its instance.
"""

from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.errors import InvalidInstanceName, InvalidOperationKey
from digest_pipeline.domain.feedback import EventType, parse_event
from digest_pipeline.domain.periods import (
    DEFAULT_INSTANCE,
    FIRST_PERIOD,
    INSTANCE_PATTERN,
    OperationKey,
    Period,
    validate_instance_name,
)

W42 = Period(2026, 42)

instances = st.from_regex(INSTANCE_PATTERN, fullmatch=True)
customer_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True)
periods = st.dates(min_value=date(2025, 1, 6), max_value=date(2099, 12, 31)).map(Period.of)


@given(instances, periods, customer_ids)
def test_every_instances_key_round_trips_through_its_text(instance, period, customer_id):
    key = OperationKey(period, customer_id, instance)
    text = str(key)

    parsed = OperationKey.parse(text)

    assert parsed == key
    assert (parsed.instance, parsed.period, parsed.customer_id) == (instance, period, customer_id)
    assert text == f"{instance}:{period}:{customer_id}"
    assert hash(parsed) == hash(key)


@given(instances.filter(lambda name: name != DEFAULT_INSTANCE), periods, customer_ids)
def test_keys_of_two_instances_never_share_a_text(instance, period, customer_id):
    ours = OperationKey(period, customer_id, instance)
    default = OperationKey(period, customer_id)
    assert ours != default
    assert str(ours) != str(default)
    assert len({ours, default}) == 2


def test_the_default_instance_keeps_todays_keys():
    key = OperationKey(W42, "customer-1842")
    assert key.instance == DEFAULT_INSTANCE == "digest"
    assert str(key) == "digest:2026-W42:customer-1842"
    assert OperationKey.parse("digest:2026-W42:customer-1842") == key


@pytest.mark.parametrize(
    "name",
    [
        "Bad-Name",  # upper case and '-': no Dagster asset key or job name takes them
        "vip-digest",  # '-'
        "vip:digest",  # ':' separates a key's parts
        "vip digest",  # whitespace
        "1digest",  # starts with a digit
        "_digest",  # starts with '_'
        "",
        "a" * 23,  # longer than 22 characters
        "digest\n",  # fullmatch: `$` would let a trailing newline through
    ],
)
def test_a_name_that_cannot_prefix_keys_and_jobs_is_refused_in_one_line(name):
    with pytest.raises(InvalidInstanceName) as refused:
        validate_instance_name(name)
    assert "\n" not in str(refused.value)
    assert repr(name) in str(refused.value)
    with pytest.raises(InvalidInstanceName):
        OperationKey(W42, "customer-1842", name)


def test_the_longest_name_is_accepted():
    assert validate_instance_name("v" + "_" * 21) == "v" + "_" * 21
    assert str(OperationKey(FIRST_PERIOD, "c", "a" * 22)) == f"{'a' * 22}:{FIRST_PERIOD}:c"


def test_a_malformed_key_names_the_form_with_its_instance():
    with pytest.raises(InvalidOperationKey, match="<instance>:2026-W42:<customer_id>"):
        OperationKey.parse("Vip:2026-W42:customer-1842")


@pytest.mark.parametrize(
    "data",
    [
        {"tags": {"operation_key": "vip_digest_2026-W42_customer-0007"}},
        {"tags": [{"name": "operation_key", "value": "vip_digest_2026-W42_customer-0007"}]},
        {
            "headers": [
                {"name": "X-Digest-Operation-Key", "value": "vip_digest:2026-W42:customer-0007"}
            ]
        },
    ],
)
def test_an_event_echoes_its_key_with_the_instance_it_carries(data):
    event = parse_event("resend", "msg_1", {"type": "email.delivered", "data": data})
    assert event.type is EventType.DELIVERED
    assert event.operation_key == OperationKey(W42, "customer-0007", "vip_digest")


def test_a_tag_of_the_default_instance_reads_as_todays_key():
    data = {"tags": {"operation_key": "digest_2026-W42_customer-0007"}}
    event = parse_event("resend", "msg_1", {"type": "email.delivered", "data": data})
    assert event.operation_key == OperationKey(W42, "customer-0007")
