"""A real shop's digests need a public https unsubscribe link and a postal address.

Off a demo ledger, a link a mailbox provider cannot reach (plain http, loopback, a private or
link-local address, a local name) or a missing address is refused in one line naming its
variable; a demo ledger keeps its loopback link and may have no address.
"""

import pytest

from digest_pipeline.domain.compliance import (
    POSTAL_ADDRESS_MAX,
    Compliance,
    compliance_refusal,
    message_id_domain,
    postal_address,
    unsubscribe_url_problem,
)

PATH = "/unsubscribe/{customer_id}?token={token}"
ADDRESS = "Example Shop Ltd, 1 Market Street, Springfield 12345"


def _asked_no_demo() -> bool:
    return False


@pytest.mark.parametrize(
    "url",
    [
        f"https://shop.example{PATH}",
        f"https://links.shop.example:8443{PATH}",
        "https://shop.example/u?c={customer_id}&t={token}",
        # a public IP literal reaches the provider too (however unusual)
        f"https://8.8.8.8{PATH}",
        f"https://[2606:4700:4700::1111]{PATH}",
        f"https://shop.example.{PATH}",
    ],
)
def test_a_public_https_link_passes(url):
    assert unsubscribe_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        # plain http: Gmail and Yahoo require https for one-click unsubscribe
        (f"http://shop.example{PATH}", "must start with https://"),
        # loopback, by name (RFC 6761) and by address, IPv4, IPv6 and IPv4-mapped
        (f"https://localhost{PATH}", "host localhost"),
        (f"https://LOCALHOST:8025{PATH}", "host localhost"),
        (f"https://unsubscribe.localhost{PATH}", "host unsubscribe.localhost"),
        (f"https://127.0.0.1:8025{PATH}", "host 127.0.0.1, a loopback address"),
        (f"https://127.9.9.9{PATH}", "a loopback address"),
        (f"https://[::1]:8025{PATH}", "host ::1, a loopback address"),
        (f"https://[::ffff:127.0.0.1]{PATH}", "a loopback address"),
        # what a browser reads as 127.0.0.1 though it is not dotted-quad
        (f"https://127.1{PATH}", "not a public host name"),
        (f"https://2130706433{PATH}", "not a public host name"),
        (f"https://0x7f.1{PATH}", "not a public host name"),
        # private (RFC 1918, RFC 4193) and link-local (RFC 3927, RFC 4291) addresses
        (f"https://10.1.2.3{PATH}", "host 10.1.2.3, a private address"),
        (f"https://172.16.0.9{PATH}", "a private address"),
        (f"https://192.168.1.20{PATH}", "host 192.168.1.20, a private address"),
        (f"https://[fd00::1]{PATH}", "a private address"),
        (f"https://169.254.169.254{PATH}", "host 169.254.169.254, a link-local address"),
        (f"https://[fe80::1]{PATH}", "a link-local address"),
        # shared address space (RFC 6598) is neither private nor global; 0.0.0.0/8 is "this host"
        (f"https://100.64.0.1{PATH}", "not a public address"),
        (f"https://0.0.0.0{PATH}", "host 0.0.0.0, a private address"),
        # names that never leave the machine or the link, and a bare label
        (f"https://printer.local{PATH}", "host printer.local, local to the machine"),
        (f"https://intranet{PATH}", "host intranet, not a public host name"),
        ("https:///unsubscribe?t={token}", "names no host"),
        # a userinfo part does not move the host: the link goes to 127.0.0.1
        (f"https://shop.example@127.0.0.1{PATH}", "a loopback address"),
    ],
)
def test_a_link_a_mailbox_provider_cannot_reach_is_named(url, says):
    problem = unsubscribe_url_problem(url)

    assert problem is not None
    assert says in problem


@pytest.mark.parametrize(
    ("compliance", "variable"),
    [
        (Compliance(f"http://shop.example{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://localhost{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://127.0.0.1{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://[::1]{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://10.0.0.8{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://192.168.0.8{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://169.254.0.8{PATH}", ADDRESS), "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(f"https://shop.example{PATH}", None), "DIGEST_POSTAL_ADDRESS"),
        # the link is named first: both are wrong in the demo's defaults
        (Compliance(f"http://127.0.0.1:8025{PATH}", None), "DIGEST_UNSUBSCRIBE_URL"),
    ],
)
def test_off_a_demo_ledger_the_refusal_is_one_line_naming_the_variable(compliance, variable):
    line = compliance_refusal(compliance, _asked_no_demo, what="digest run")

    assert line is not None
    assert line.startswith(f"digest run refused: {variable} ")
    assert "\n" not in line


def test_a_public_https_link_with_an_address_passes_off_a_demo_ledger():
    compliance = Compliance(f"https://shop.example{PATH}", ADDRESS)

    assert compliance_refusal(compliance, _asked_no_demo, what="delivery") is None


def test_a_demo_ledger_keeps_its_loopback_link_and_may_have_no_address():
    demo = Compliance(f"http://127.0.0.1:8025{PATH}", None)

    assert compliance_refusal(demo, lambda: True, what="digest serve") is None


def test_the_ledger_is_not_asked_when_nothing_needs_the_demos_leave():
    def never() -> bool:
        raise AssertionError("asked the ledger")

    compliance = Compliance(f"https://shop.example{PATH}", ADDRESS)
    assert compliance_refusal(compliance, never, what="delivery") is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (ADDRESS, ADDRESS),
        ("  Shop GmbH, Hauptstraße 5, 10115 Berlin  ", "Shop GmbH, Hauptstraße 5, 10115 Berlin"),
        ("x" * POSTAL_ADDRESS_MAX, "x" * POSTAL_ADDRESS_MAX),
    ],
)
def test_a_one_line_postal_address_is_kept_stripped(raw, expected):
    assert postal_address(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "1 Market Street\nSpringfield",  # a second line
        "1 Market Street\rBcc: x@y.example",
        "1 Market\tStreet",
        "1 Market Street\x00",
        "1 Market Street\u2028Springfield",  # the Unicode line separator
        "1 \u202eteertS tekraM",  # a bidi override would show another address
        "1 Market Street \udcff",  # a lone surrogate: not text
        "x" * (POSTAL_ADDRESS_MAX + 1),
    ],
)
def test_a_postal_address_of_more_than_one_printable_line_is_refused(raw):
    with pytest.raises(ValueError, match="must be"):
        postal_address(raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("mail.shop.example", "mail.shop.example"),
        ("Shop.Example.", "shop.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ],
)
def test_a_message_id_domain_is_a_hostname(raw, expected):
    assert message_id_domain(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "localhost",  # a bare label names no one's domain
        "digest@shop.example",
        "https://shop.example",
        "shop..example",
        "-shop.example",
        "shop.example>\r\nBcc: x@y.example",
        "bücher.example",
        "a" * 64 + ".example",
        ".".join(["a" * 60] * 5),  # 304 characters
    ],
)
def test_a_message_id_domain_that_is_not_a_hostname_is_refused(raw):
    with pytest.raises(ValueError, match="must be a hostname"):
        message_id_domain(raw)
