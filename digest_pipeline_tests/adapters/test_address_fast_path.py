"""The composer accepts the common address by a pattern before parsing it: the pattern must never
accept an address the full check refuses, or a refused recipient would reach the To header."""

from hypothesis import given, settings
from hypothesis import strategies as st

from digest_pipeline.adapters.mail import mime, render

plain = st.from_regex(mime.PLAIN_ADDRESS, fullmatch=True)
# near misses: the pattern's alphabet plus what display names and header smuggling are made of
near = st.lists(
    st.sampled_from([*"ab.Z9-_+@\"'() <>,;:\\[]\r\n\t\x00é", "@x.io", ".."]),
    max_size=16,
).map("".join)


@settings(max_examples=400)
@given(plain)
def test_every_address_the_pattern_takes_is_one_the_full_check_takes(address):
    assert render._parses_as_one_address(address)


@settings(max_examples=600)
@given(st.one_of(plain, near, st.text(max_size=24)))
def test_the_pattern_never_changes_a_verdict(recipient):
    assert render._is_single_address(recipient) == render._parses_as_one_address(recipient)


def test_a_second_address_or_a_display_name_is_refused_on_both_paths():
    for refused in ["a@x.io,b@y.io", "Eve <eve@x.io>", "a@x.io\r\nBcc: b@y.io", "@x.io"]:
        assert not render._is_single_address(refused)
