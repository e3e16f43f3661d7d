"""A real shop's digests need a public https one-click unsubscribe link and a postal address.

Gmail's and Yahoo's bulk-sender rules require a one-click unsubscribe (RFC 8058) over https
that the mailbox provider can reach, and CAN-SPAM (15 U.S.C. §7704(a)(5)) a valid physical
postal address in every commercial message. `compliance_refusal` stops `digest run`, `digest
sweep`, `digest serve` and a Dagster delivery step at start when either is missing or wrong,
except on a ledger that holds `digest seed` demo data, whose links point at `digest serve` on
loopback. The checks read the settings only: nothing here resolves a name or opens a socket.
"""

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

URL_VARIABLE = "DIGEST_UNSUBSCRIBE_URL"
POSTAL_VARIABLE = "DIGEST_POSTAL_ADDRESS"
#: a one-line postal address is well under this; a longer value is a pasted document, not one
POSTAL_ADDRESS_MAX = 200
#: RFC 1035 §2.3.4 (a label of 63 octets at most, a name of 253 in its text form)
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOTTED_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})+")
_HOSTNAME_MAX = 253
#: WHATWG URL "ends in a number": a browser reads `127.1`, `2130706433` or `0x7f.1` as an IPv4
#: address, which `ipaddress` would not recognise; no public name ends in a numeric label
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
#: names that never leave the machine or the link: RFC 6761 §6.3 (localhost), RFC 6762 (mDNS)
_LOCAL_SUFFIXES = ("localhost", "local")


@dataclass(frozen=True)
class Compliance:
    """The settings every digest's footer and List-Unsubscribe header are made from."""

    #: `DIGEST_UNSUBSCRIBE_URL`, a template holding `{token}` (and optionally `{customer_id}`)
    unsubscribe_url: str
    #: `DIGEST_POSTAL_ADDRESS`, one checked line (`postal_address`), or None when unset
    postal_address: str | None


def postal_address(raw: str) -> str:
    """`DIGEST_POSTAL_ADDRESS`'s value: one line of printable text, stripped, bounded.

    Raises:
        ValueError: a line break, tab or other control or format character (a bidi override
            could make the footer show another address than the one configured), or text
            longer than `POSTAL_ADDRESS_MAX` characters.
    """
    line = raw.strip()
    if not line.isprintable():
        raise ValueError(
            "must be one line of printable text (no line breaks or control characters)"
        )
    if len(line) > POSTAL_ADDRESS_MAX:
        raise ValueError(f"must be at most {POSTAL_ADDRESS_MAX} characters")
    return line


def message_id_domain(raw: str) -> str:
    """`DIGEST_MESSAGE_ID_DOMAIN`'s value: a dotted ASCII hostname, lower-cased, no final dot.

    Raises:
        ValueError: anything else (an address, a URL, a bare label, a non-ASCII name).
    """
    name = raw.strip().lower().removesuffix(".")
    if len(name) > _HOSTNAME_MAX or not _DOTTED_HOSTNAME.fullmatch(name):
        raise ValueError(
            "must be a hostname such as mail.shop.example (ASCII letters, digits and '-' in two "
            "labels or more; an international name in its xn-- form)"
        )
    return name


def url_template(raw: str) -> str:
    """`DIGEST_UNSUBSCRIBE_URL`'s value: an http(s) URL template holding `{token}`.

    Only the shape is checked here; whether the link may go to real customers is
    `unsubscribe_url_problem`'s question, asked at start against the ledger.
    """
    if not raw.startswith(("http://", "https://")) or "{token}" not in raw:
        raise ValueError("must be an http(s) URL holding {token} (and optionally {customer_id})")
    return raw


def _ip_problem(host: str) -> str | None:
    """Why an IP literal cannot be reached from a mailbox provider, or None for a public one."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"names host {host}, not a public host name"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return f"names host {host}, a loopback address"
    if ip.is_link_local:
        return f"names host {host}, a link-local address"
    if ip.is_private:
        return f"names host {host}, a private address"
    if not ip.is_global:
        return f"names host {host}, not a public address"
    return None


def unsubscribe_url_problem(template: str) -> str | None:
    """Why the unsubscribe link cannot serve real customers, or None when it can.

    It must be https (RFC 8058 §3.1 leaves the scheme open; Gmail and Yahoo demand https) and
    name a host a mailbox provider can reach: not `localhost` or a `.local` name, not a
    loopback, private, link-local or otherwise non-public IP literal, not a bare label.
    """
    try:
        parts = urlsplit(template.format(customer_id="c", token="t"))
        host = (parts.hostname or "").rstrip(".")
    except (ValueError, KeyError, IndexError, AttributeError):
        # a malformed template or port, `[` without `]`: `url_template` lets the shape through
        return "is not a URL"
    if parts.scheme != "https":
        return "must start with https://"
    if not host:
        return "names no host"
    labels = host.split(".")
    if labels[-1] in _LOCAL_SUFFIXES:
        return f"names host {host}, local to the machine or its network"
    if ":" in host or _NUMERIC_LABEL.fullmatch(labels[-1]):
        return _ip_problem(host)
    if len(labels) < 2:
        return f"names host {host}, not a public host name"
    return None


def compliance_refusal(
    compliance: Compliance, holds_demo_data: Callable[[], bool], *, what: str
) -> str | None:
    """Why `what` must not start with these settings, or None when it may.

    The first problem only, as one line naming its variable. A demo ledger may use anything
    `url_template` accepted and no postal address (its customers are made up, and its links
    point at `digest serve` on loopback); `holds_demo_data` is asked only when there is a
    problem.
    """
    problem = unsubscribe_url_problem(compliance.unsubscribe_url)
    if problem is not None:
        refusal = f"{URL_VARIABLE} {problem}; mailbox providers need a public https one-click link"
    elif compliance.postal_address is None:
        refusal = (
            f"{POSTAL_VARIABLE} is not set; every digest must show the sender's postal address"
        )
    else:
        return None
    if holds_demo_data():
        return None
    return f"{what} refused: {refusal} (this ledger holds no `digest seed` demo data)"
