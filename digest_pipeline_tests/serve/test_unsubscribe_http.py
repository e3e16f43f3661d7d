"""RFC 8058 one-click unsubscribe over HTTP: POST suppresses, GET never does, refusals change nothing.

A forged, cross-customer or missing token is 403 for every customer id, known or not, so the
endpoint cannot tell anyone who is a customer; only a good token for an unknown id is 404.
"""

import pytest

from digest_pipeline.domain.feedback import SuppressionReason
from digest_pipeline.domain.unsubscribe import unsubscribe_token
from digest_pipeline_tests.serve.conftest import ONE_CLICK, ONE_CLICK_BODY, SECRET, link

MULTIPART = (
    b"--b0undary\r\n"
    b'Content-Disposition: form-data; name="List-Unsubscribe"\r\n\r\n'
    b"One-Click\r\n"
    b"--b0undary--\r\n"
)


def one_click(site, path: str, **kwargs):
    return site.http.post(path, content=ONE_CLICK_BODY, headers=ONE_CLICK, **kwargs)


def test_a_one_click_post_unsubscribes_and_a_repeat_is_still_2xx(site):
    first = one_click(site, link("customer-0001"))
    again = one_click(site, link("customer-0001"))

    assert (first.status_code, again.status_code) == (200, 200)
    assert first.text == again.text  # already unsubscribed reads exactly the same
    (only,) = site.store.suppressions()
    assert (only.customer_id, only.reason, only.source) == (
        "customer-0001",
        SuppressionReason.UNSUBSCRIBED,
        "one_click",
    )
    assert only.created_at == site.clock.now()


def test_the_response_carries_no_customer_data_and_is_never_cached(site):
    response = one_click(site, link("customer-0002"))
    assert response.status_code == 200
    assert "customer-0002" not in response.text
    assert "@" not in response.text
    assert unsubscribe_token(SECRET, "customer-0002") not in response.text
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert "server" not in response.headers


def test_a_multipart_one_click_post_unsubscribes_too(site):
    response = site.http.post(
        link("customer-0003"),
        content=MULTIPART,
        headers={"content-type": "multipart/form-data; boundary=b0undary"},
    )
    assert response.status_code == 200
    assert [s.customer_id for s in site.store.suppressions()] == ["customer-0003"]


def test_a_get_shows_a_confirmation_form_and_never_unsubscribes(site):
    before = site.dump()
    page = site.http.get(link("customer-0001"))
    head = site.http.head(link("customer-0001"))

    assert (page.status_code, head.status_code) == (200, 200)
    assert '<form method="post">' in page.text
    assert 'name="List-Unsubscribe" value="One-Click"' in page.text
    assert "customer-0001" not in page.text
    assert site.dump() == before
    assert site.store.suppressions() == []


def test_the_confirmation_form_posts_exactly_the_one_click_body(site):
    # what a browser sends for the page's form: its hidden field, form-encoded, to the same URL
    page = site.http.get(link("customer-0004"))
    assert page.status_code == 200
    response = site.http.post(link("customer-0004"), data={"List-Unsubscribe": "One-Click"})
    assert response.status_code == 200
    assert [s.customer_id for s in site.store.suppressions()] == ["customer-0004"]


@pytest.mark.parametrize(
    ("customer_id", "token"),
    [
        ("customer-0001", unsubscribe_token(SECRET, "customer-0002")),  # another customer's
        ("customer-0001", unsubscribe_token("another-secret", "customer-0001")),  # forged
        ("customer-0001", ""),  # missing
        ("customer-0001", unsubscribe_token(SECRET, "customer-0001")[:-1]),  # cut short
        ("customer-0404", "0" * 32),  # an id nobody knows: the same 403, no existence oracle
        ("customer-0404", unsubscribe_token(SECRET, "customer-0001")),
    ],
    ids=["cross-customer", "forged", "missing", "truncated", "unknown-forged", "unknown-other"],
)
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_bad_token_is_403_for_any_id_and_changes_nothing(site, customer_id, token, method):
    before = site.dump()
    path = link(customer_id, token) if token else f"/unsubscribe/{customer_id}"
    response = one_click(site, path) if method == "POST" else site.http.get(path)
    assert response.status_code == 403
    assert customer_id not in response.text
    assert site.dump() == before


def test_only_a_good_token_learns_that_an_id_is_unknown(site):
    before = site.dump()
    assert one_click(site, link("customer-0404")).status_code == 404
    assert site.http.get(link("customer-0404")).status_code == 404
    assert site.dump() == before


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (ONE_CLICK, b""),
        (ONE_CLICK, b"List-Unsubscribe=Yes"),
        ({"content-type": "application/json"}, b'{"List-Unsubscribe": "One-Click"}'),
    ],
    ids=["empty", "other-value", "json"],
)
def test_a_post_without_the_one_click_body_is_400_and_changes_nothing(site, headers, body):
    before = site.dump()
    response = site.http.post(link("customer-0001"), content=body, headers=headers)
    assert response.status_code == 400
    assert site.dump() == before


def test_an_oversized_body_is_refused_unread(site):
    before = site.dump()
    response = site.http.post(link("customer-0001"), content=b"x" * 100_000, headers=ONE_CLICK)
    assert response.status_code == 413
    assert site.dump() == before


def test_other_paths_and_methods_are_not_served(site):
    assert site.http.get("/").status_code == 404
    assert site.http.get("/unsubscribe").status_code == 404
    assert site.http.put(link("customer-0001")).status_code == 405
    assert site.http.get("/events/resend").status_code == 405
