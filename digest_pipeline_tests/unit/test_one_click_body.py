"""The RFC 8058 body in both encodings the RFC allows, and what is not it (`serve/forms.py`)."""

import pytest

from digest_pipeline.serve.forms import is_one_click

MULTIPART = (
    b"--XyZ\r\n"
    b'Content-Disposition: form-data; name="List-Unsubscribe"\r\n\r\n'
    b"One-Click\r\n"
    b"--XyZ--\r\n"
)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"List-Unsubscribe=One-Click"),
        ("application/x-www-form-urlencoded; charset=utf-8", b"List-Unsubscribe=One-Click\r\n"),
        ("Application/X-WWW-Form-Urlencoded", b"a=1&List-Unsubscribe=One-Click"),
        ("multipart/form-data; boundary=XyZ", MULTIPART),
        ("text/plain", b"List-Unsubscribe=One-Click"),
        (None, b"List-Unsubscribe=One-Click"),
    ],
)
def test_the_one_click_body_is_read_in_every_encoding_a_client_uses(content_type, body):
    assert is_one_click(content_type, body)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b""),
        ("application/x-www-form-urlencoded", b"List-Unsubscribe=Yes"),
        ("application/x-www-form-urlencoded", b"list-unsubscribe=one-click"),
        ("application/json", b'{"List-Unsubscribe": "One-Click"}'),
        ("multipart/form-data; boundary=XyZ", b"List-Unsubscribe=One-Click"),
        ("multipart/form-data", MULTIPART),  # no boundary
        ("multipart/form-data; boundary=XyZ", MULTIPART.replace(b"One-Click", b"Nope")),
        ("application/x-www-form-urlencoded", b"List-Unsubscribe=One-Click\xff"),
        ("not a type", b"List-Unsubscribe=One-Click"),
    ],
)
def test_anything_else_is_not_a_one_click_request(content_type, body):
    assert not is_one_click(content_type, body)
