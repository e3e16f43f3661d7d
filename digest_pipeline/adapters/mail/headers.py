"""The headers every digest carries beside From, To and Subject, named after the sender's domain.

Design §7's Message-ID and `X-Digest-Operation-Key`, RFC 8058's one-click `List-Unsubscribe`, an
RFC 2919 `List-Id` and a `Feedback-ID`: the last two name the sender's domain and the week,
never a customer. The Message-ID's key is derived from the unsubscribe secret under its own label.
"""

import hashlib
import hmac
import re
from datetime import datetime
from email.utils import format_datetime, parseaddr
from functools import lru_cache

from digest_pipeline.domain.periods import OperationKey

#: RFC 2919 list-label and phrase: the same for every week, so a receiver's filters and
#: reputation follow one list for as long as the sender's domain stays the same
LIST_LABEL = "weekly-digest"
LIST_PHRASE = "Weekly digest"
#: a hostname of one label or more (RFC 2919 allows the bare `localhost`), ASCII after IDNA
_HOSTNAME = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")
#: the label that separates the Message-ID key from the unsubscribe tokens' use of the secret
_MESSAGE_ID_LABEL = b"digest-message-id"


def message_id_key(secret: str) -> bytes:
    """The install's Message-ID key: HMAC-SHA256(secret, "digest-message-id")."""
    return hmac.new(secret.encode(), _MESSAGE_ID_LABEL, hashlib.sha256).digest()


def sender_domain(sender: str) -> str | None:
    """The sender address's domain as an ASCII hostname (IDNA), or None if it has none."""
    try:
        domain = parseaddr(sender)[1].rpartition("@")[2].lower()
        ascii_domain = domain.encode("idna").decode("ascii")
    except Exception:
        # UnicodeError for a label IDNA refuses; the parser may crash on malformed input
        return None
    return ascii_domain if _HOSTNAME.fullmatch(ascii_domain) else None


def _list_headers(key: OperationKey, domain: str | None) -> tuple[tuple[str, str], ...]:
    if domain is None:
        return ()
    return (
        # RFC 2919 §3: a phrase and `<list-label.namespace>`, the namespace a domain the
        # sender controls, so no one else can claim the same id
        ("List-Id", f"{LIST_PHRASE} <{LIST_LABEL}.{domain}>"),
        # Gmail's `CampaignId:CustomerId:Other:SenderId`: the week is the campaign, so its
        # complaint rate is reported per week, and per digest instance; nothing in it names a
        # recipient
        ("Feedback-ID", f"{key.period}:{key.instance}:weekly:{domain}"),
    )


def digest_headers(
    key: OperationKey, unsubscribe: str, now: datetime, domain: str | None, message_id: str
) -> tuple[tuple[str, str], ...]:
    """The headers of `key`'s digest, in the order they are written."""
    return (
        ("Message-ID", message_id),
        ("X-Digest-Operation-Key", str(key)),
        ("List-Unsubscribe", f"<{unsubscribe}>"),
        ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"),
        *_list_headers(key, domain),
        ("Date", _date(now.replace(microsecond=0))),
    )


#: the Date header of a second: every message composed in the same second shares it
_date = lru_cache(maxsize=4)(format_datetime)
