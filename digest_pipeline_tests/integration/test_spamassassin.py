"""SpamAssassin's local rules score a digest, byte for byte as the SMTP path sends it, at 0 or below.

The digest is composed as the product composes it (`wiring.build_composer` over settings read
from the environment) with a real-looking sender domain and https unsubscribe link, sent by the
SMTP mailer to the aiosmtpd peer, and the bytes the peer received (every header: From, To,
Subject, Date, Message-ID, List-Unsubscribe(-Post), List-Id, Feedback-ID, the MIME parts) are
scored by `spamassassin -L -t`: local rules only, no network. A failure names the rules that fired.
"""

import dataclasses
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from email.parser import BytesHeaderParser
from email.policy import default as default_policy
from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.model import DigestRow, Message, WorkItem
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.conftest import require_tool
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.smtp_peer import SmtpPeer

pytestmark = pytest.mark.integration

#: a shop's own sending subdomain and a public https unsubscribe endpoint, as in production
ENV = {
    "DIGEST_FROM_ADDRESS": "digest@news.lindenhome.com",
    "DIGEST_UNSUBSCRIBE_URL": "https://news.lindenhome.com/unsubscribe/{customer_id}?token={token}",
    "DIGEST_UNSUBSCRIBE_SECRET": "k3Jd8f0qLw2ZrT5nV9xYbC4mE7hA1sGu",
    "DIGEST_POSTAL_ADDRESS": "Linden Home Ltd, 12 Market Street, Leeds LS1 6DT, United Kingdom",
}
RECIPIENT = "ada.king@example.net"
PRODUCTS = [
    ("Walnut chopping board", "34.90", "walnut-chopping-board"),
    ("Linen tea towels, set of 3", "18.50", "linen-tea-towels"),
    ("Stoneware mixing bowl", "27.00", "stoneware-mixing-bowl"),
    ("Beeswax food wraps", "12.95", "beeswax-food-wraps"),
]
SPAMASSASSIN_TIMEOUT_SECONDS = 120
_SCORE = re.compile(r"score=(-?\d+(?:\.\d+)?)")
#: the rule list up to the next `name=` field; SpamAssassin folds it after a comma
_TESTS = re.compile(r"tests=([\w,\s]*?)(?:\s+\w+=|$)")


@dataclasses.dataclass(frozen=True)
class Verdict:
    score: float
    rules: tuple[str, ...]
    #: SpamAssassin's "Content analysis details" table: points, rule, description per hit
    report: str


@pytest.fixture(scope="module")
def spamassassin() -> Path:
    found = shutil.which("spamassassin")
    return require_tool(Path(found) if found else None, "spamassassin", "spamassassin")


def digest(root: Path) -> Message:
    """This week's digest of four picks for one customer, composed as `digest run` does."""
    now = datetime.now(UTC).replace(microsecond=0)  # a stale Date would be a rule of its own
    iso = now.isocalendar()
    key = OperationKey(Period(iso.year, iso.week), "customer-1842")
    item = WorkItem(key=key, state=DeliveryState.CLAIMED, created_at=now, next_attempt_at=None)
    shop = "https://www.lindenhome.com/products"
    rows = [
        DigestRow(
            key,
            n,
            {
                "title": title,
                "price": price,
                "currency": "GBP",
                "url": f"{shop}/{slug}",
                "image_url": f"https://cdn.lindenhome.com/products/{slug}.jpg",
                "customer_name": "Ada",
            },
        )
        for n, (title, price, slug) in enumerate(PRODUCTS)
    ]
    composer = build_composer(load_settings(ENV, root), FixedClock(now))
    return composer.compose(item, RECIPIENT, rows)


def as_sent(msg: Message) -> bytes:
    """The bytes the SMTP mailer delivers, as a relay received them."""
    with SmtpPeer() as peer:
        mailer = SmtpMailer(peer.settings(timeout_seconds=10.0))
        try:
            outcome = mailer.send(msg, idempotency_key=str(msg.key))
        finally:
            mailer.close()
        assert outcome.accepted, outcome
        (received,) = peer.messages
    return received.raw


def score(binary: Path, raw: bytes, home: Path) -> Verdict:
    """`spamassassin -L -t` of `raw`, with HOME at `home`.

    So no user's preferences or Bayes database are read, and nothing is learned into them.
    (SpamAssassin still makes an empty `.spamassassin` in the passwd home of the user it runs
    as: its global state folder, which it finds by getpwuid, not HOME; local tests write none.)
    """
    done = subprocess.run(
        [str(binary), "-L", "-t"],
        input=raw,
        capture_output=True,
        env={**os.environ, "HOME": str(home)},
        timeout=SPAMASSASSIN_TIMEOUT_SECONDS,
        check=False,
    )
    status = BytesHeaderParser(policy=default_policy).parsebytes(done.stdout)["X-Spam-Status"]
    stderr = done.stderr.decode("utf-8", "replace")[-2000:]
    assert done.returncode == 0, stderr
    assert status, stderr
    unfolded = re.sub(r"\s+", " ", str(status))
    found, tests = _SCORE.search(unfolded), _TESTS.search(unfolded)
    assert found is not None, unfolded
    assert tests is not None, unfolded
    text = done.stdout.decode("utf-8", "replace")
    report = text[text.find("Content analysis details") :] if "Content analysis" in text else ""
    rules = tuple(r for r in re.split(r"[,\s]+", tests.group(1)) if r and r != "none")
    return Verdict(float(found.group(1)), rules, report.strip())


def test_a_digest_as_the_smtp_path_sends_it_scores_at_most_zero(spamassassin, tmp_path):
    raw = as_sent(digest(tmp_path))
    headers = BytesHeaderParser(policy=default_policy).parsebytes(raw)
    for name in ("From", "To", "Subject", "Date", "Message-ID", "List-Unsubscribe"):
        assert headers[name], f"{name} missing from what the mailer sent"
    assert headers["List-Unsubscribe"].startswith("<https://news.lindenhome.com/")

    verdict = score(spamassassin, raw, tmp_path)

    assert verdict.score <= 0, f"score {verdict.score}: {verdict.rules}\n{verdict.report}"


def test_an_obviously_spammy_digest_scores_above_zero(spamassassin, tmp_path):
    # the check above must be able to fail: the same digest under a shouting, prize-draw subject
    spammy = dataclasses.replace(digest(tmp_path), subject="FREE!!! CLAIM YOUR PRIZE NOW, WINNER")

    verdict = score(spamassassin, as_sent(spammy), tmp_path)

    assert verdict.score > 0, f"score {verdict.score}: {verdict.rules}\n{verdict.report}"
