"""The operation key as an SES tag value: within SES's alphabet and length, and back again exactly."""

import re
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.errors import InvalidOperationKey
from digest_pipeline.domain.periods import INSTANCE_PATTERN, OperationKey, Period
from digest_pipeline.domain.ses_tags import MAX_TAG_LENGTH, key_of_tag, tag_value

#: the SES v2 `MessageTag` reference: ASCII letters, digits, `_` and `-`, at most 256
SES_TAG_VALUE = re.compile(r"[A-Za-z0-9_-]{1,256}")

periods = st.dates(date(2025, 1, 6), date(2099, 12, 31)).map(lambda d: Period(*d.isocalendar()[:2]))
customer_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True)
instances = st.from_regex(INSTANCE_PATTERN, fullmatch=True)
keys = st.builds(OperationKey, periods, customer_ids, instances)


@given(keys)
def test_every_key_round_trips_through_a_value_ses_accepts(key: OperationKey) -> None:
    value = tag_value(key)
    assert SES_TAG_VALUE.fullmatch(value)
    assert key_of_tag(value) == key
    assert tag_value(str(key)) == value


def test_the_longest_key_fits_with_room_to_spare() -> None:
    key = OperationKey(Period(2026, 42), "Z" * 128, "v" * 22)
    assert len(str(key)) == 160
    assert len(tag_value(key)) == 214 <= MAX_TAG_LENGTH


def test_a_key_reads_as_base64url_of_its_text() -> None:
    # what an operator sees in the SES console or an event, and can decode by hand
    assert tag_value("digest:2026-W42:customer-1842") == "ZGlnZXN0OjIwMjYtVzQyOmN1c3RvbWVyLTE4NDI"


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "",
        "ZGlnZXN0OjIwMjYtVzQyOmN1c3RvbWVyLTE4NDI=",  # padded: not what tag_value writes
        "ZGlnZXN0OjIwMjYtVzQyOmN1c3RvbWVyLTE4NDJ",  # other trailing bits: another spelling
        "ZGlnZXN0",  # `digest`: decodes, but not to a key
        "IGRpZ2VzdDoyMDI2LVc0MjpjdXN0b21lci0xODQy",  # ` digest:…`: a key only once stripped
        "ZGln+XN0",  # outside SES's alphabet
        "A" * (MAX_TAG_LENGTH + 4),
        "_-_-",  # decodes to bytes that are not ASCII
    ],
)
def test_anything_but_an_encoded_key_is_refused_without_repeating_it(value: object) -> None:
    with pytest.raises(InvalidOperationKey) as refused:
        key_of_tag(value)
    assert str(refused.value) == "the SES tag is not an encoded operation key"
