"""The digest as customers see it: subject, preheader, text and HTML parts from Jinja2 templates.

The templates are the package's, or the shop's of the same names (`DIGEST_TEMPLATE_DIR`, checked
when the composer is built: templates.py), with the shop's brand (`domain.brand`) and prices in
its locale (prices.py). Every digest carries the headers of headers.py (design §7, RFC 8058
one-click unsubscribe, an RFC 2919 List-Id and a Feedback-ID, both named after the sender's
domain and never a customer), and both parts' footers show the sender's postal address
(`DIGEST_POSTAL_ADDRESS`, CAN-SPAM). Anything that cannot become a safe message raises
RenderError with a one-line reason naming the operation key, never the address or content, so
delivery records a permanent failure for that item. A refused pick is named by its row
position, its product id and the field (`digest row 2 (product prod-0042) has an invalid
image_url`), so the operator knows which catalogue row to fix. The link's token is
`domain.unsubscribe.unsubscribe_token` (re-exported here), the one `digest serve` checks.

The Message-ID is keyed by the install: HMAC-SHA256 under a key derived from the unsubscribe
secret (never the secret itself, so it reveals no token material), at `DIGEST_MESSAGE_ID_DOMAIN`
(the sender's domain by default), and the same for every retry of one operation key. After `digest rotate-secret` later sends carry other
Message-IDs, so a receiver sees a resend after the rotation as a new message, not a duplicate.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from email.headerregistry import Address
from functools import lru_cache, partial
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

import jinja2
import markupsafe

from digest_pipeline.adapters.forkable import recipe_of
from digest_pipeline.adapters.mail.headers import digest_headers, sender_domain
from digest_pipeline.adapters.mail.headers import message_id_key as message_id_key
from digest_pipeline.adapters.mail.mime import PLAIN_ADDRESS, check_headers, to_bytes
from digest_pipeline.adapters.mail.prices import formatted_price, known_locale
from digest_pipeline.adapters.mail.templates import check_templates, environment, load
from digest_pipeline.domain.brand import Brand, brand_problem
from digest_pipeline.domain.catalogue import encodable, is_web_link, shown_id
from digest_pipeline.domain.compliance import Compliance, message_id_domain, postal_address
from digest_pipeline.domain.errors import InvalidRecipient, RenderError
from digest_pipeline.domain.model import DigestRow, Message, WorkItem, keyed_message_id
from digest_pipeline.domain.periods import FIRST_PERIOD, OperationKey
from digest_pipeline.domain.unsubscribe import token_signer
from digest_pipeline.domain.unsubscribe import unsubscribe_token as unsubscribe_token
from digest_pipeline.ports import Clock, Composer

# \s covers CR, LF and the Unicode line separators; the range covers every other C0/C1 control.
_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
_CURRENCY = re.compile(r"[A-Z]{3}")
#: the package's look: its templates' own colours and no logo, named "Example Shop"
_DEFAULT_BRAND = Brand()
_SUBJECT_MAX = 150
_TEMPLATES = ("subject.txt.j2", "preheader.txt.j2", "digest.txt.j2", "digest.html.j2")
#: one pick's block of each part, rendered once per pick (and number) and reused by every
#: message that shows it: a week shows a few hundred products, four to each of its customers
_PICK_TEMPLATES = ("pick.html.j2", "pick.txt.j2")
_PICK_BLOCKS_KEPT = 4096
#: the longest customer id there can be (periods.validate_customer_id), for the settings probe
_PROBE_KEY = OperationKey(FIRST_PERIOD, "x" * 128)
#: the Message-ID domain of a sender without one; compose refuses such a sender anyway
_NO_DOMAIN = "digest.invalid"
#: the footer's address when `DIGEST_POSTAL_ADDRESS` is unset. Only a demo ledger gets that far
#: (a real one is refused at start, domain/compliance.py); a marked placeholder, not an empty
#: line, so the demo shows where the address goes and a message that ever went out without one
#: would say so instead of hiding it.
DEMO_POSTAL_ADDRESS = "[demo: no postal address; set DIGEST_POSTAL_ADDRESS]"


def _one_line(text: str, limit: int | None = None) -> str:
    # Printable text holds no character `_CONTROL` matches but the plain space (a test walks
    # every code point), and `strip` removes exactly what `\s` matches: once stripped, only a
    # run of spaces needs the substitution, which replaces every single space of the line.
    line = text.strip()
    if not line.isprintable() or "  " in line:
        line = _CONTROL.sub(" ", text).strip()
    return line if limit is None or len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _is_single_address(recipient: str) -> bool:
    # The common address, a dot-atom at a dot-atom of hostname labels, is one the parser below
    # accepts unchanged (a Hypothesis property holds them together); only the rest is parsed,
    # which costs a large share of composing a digest.
    return PLAIN_ADDRESS.fullmatch(recipient) is not None or _parses_as_one_address(recipient)


def _parses_as_one_address(recipient: str) -> bool:
    # Whitespace and quotes are refused outright: they are how display names and a second
    # header line get smuggled into To.
    if recipient.count("@") != 1 or _CONTROL.search(recipient) or '"' in recipient:
        return False
    try:
        address = Address(addr_spec=recipient)
    except Exception:
        # Not only ValueError and HeaderParseError: CPython 3.11's parser crashes on `x@[` with
        # AttributeError and on deeply nested comments with RecursionError.
        return False
    return bool(address.username and address.domain) and address.addr_spec == recipient


@dataclass(frozen=True)
class _Pick:
    title: str
    price: str | None
    url: str
    image_url: str | None


@dataclass(frozen=True)
class _PickBlocks:
    """The picks' blocks of each part, as the digest templates place them."""

    #: escaped as it was rendered (`pick.html.j2` is autoescaped), so never escaped again
    html: markupsafe.Markup
    text: str


def _where(row: DigestRow) -> str:
    """`digest row 2 (product prod-0042)`: where a refusal is, by position and product id only."""
    product_id = row.payload.get("product_id")
    named = f"product {shown_id(product_id)}" if product_id else "no product id"
    return f"digest row {row.position} ({named})"


def _refused(key: OperationKey, row: DigestRow, problem: str) -> RenderError:
    return RenderError(f"{key}: {_where(row)} {problem}")


class _Problem(Exception):
    """What is wrong with a row's fields; `pick_of` names the row."""


def _link(value: object, name: str) -> str | None:
    if value is None or value == "":
        return None
    # Autoescaping does not stop a `javascript:` href: only web links may reach the HTML, by
    # the rule that screens the catalogue, so a row content generation wrote always renders.
    if not is_web_link(value):
        if not encodable(str(value)):
            raise _Problem(f"has a {name} that is not valid Unicode")
        raise _Problem(f"has an invalid {name}")
    return str(value)


def _price(raw: object, currency_raw: object, locale: str | None) -> str | None:
    currency = str(currency_raw or "EUR").upper()
    if raw is None or raw == "":
        return None
    try:
        amount = Decimal(str(raw))
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite() or amount < 0:
        raise _Problem("has an invalid price")
    if not _CURRENCY.fullmatch(currency):
        raise _Problem("has an invalid currency")
    return formatted_price(amount, currency, locale)


def _checked_pick(
    title_raw: object,
    url: object,
    image_url: object,
    price: object,
    currency: object,
    *,
    locale: str | None = None,
) -> _Pick:
    title = _one_line(str(title_raw or ""))
    if not title:
        raise _Problem("lacks a title")
    if not encodable(title):
        raise _Problem("has a title that is not valid Unicode")
    link = _link(url, "url")
    if link is None:
        raise _Problem("lacks a url")
    return _Pick(title, _price(price, currency, locale), link, _link(image_url, "image_url"))


#: a week's rows show a few hundred products to every customer: each one is checked once
#: (a refusal is not cached, so it is raised again with its own row's name); `typed`, since
#: `1 == 1.0 == True` as keys, and `str()` of each differs; the locale is part of the key
_cached_pick = lru_cache(maxsize=4096, typed=True)(_checked_pick)
#: the payload fields a pick is made of, in `_checked_pick`'s order (`pick_of` reads them inline;
#: a property test holds the two together)
_PICK_FIELDS = ("title", "url", "image_url", "price", "currency")
#: the JSON scalars, hashable; anything else takes the uncached path
_SCALARS = frozenset((str, int, float, bool, type(None)))


def pick_of(key: OperationKey, row: DigestRow, locale: str | None = None) -> _Pick:
    """One generated row as the templates see it; RenderError names a row that cannot be shown.

    Its price is written as `locale` writes prices (None: the package's own format).
    """
    p = row.payload
    fields = (p.get("title"), p.get("url"), p.get("image_url"), p.get("price"), p.get("currency"))
    cacheable = {type(v) for v in fields} <= _SCALARS
    check = _cached_pick if cacheable else _checked_pick
    try:
        return check(*fields, locale=locale)
    except _Problem as e:
        raise _refused(key, row, str(e)) from None


class Jinja2Composer(Composer):
    """Renders the package's digest templates, or the shop's of the same names (`template_dir`).

    The HTML template is autoescaped and the text templates are not; a missing template
    variable raises (StrictUndefined) instead of rendering as an empty string. `shop_name` is
    `brand.shop_name`'s shorthand. Templates that do not parse, fail on a sample digest or
    leave out the unsubscribe link or the postal address are refused here (TemplateRefused).
    """

    def __init__(
        self,
        *,
        sender: str,
        unsubscribe_url: str,
        unsubscribe_secret: str,
        clock: Clock,
        shop_name: str | None = None,
        postal_address: str | None = None,
        message_id_domain: str | None = None,
        brand: Brand = _DEFAULT_BRAND,
        template_dir: Path | None = None,
    ) -> None:
        self._brand = brand if shop_name is None else replace(brand, shop_name=shop_name)
        self._template_dir = template_dir.resolve() if template_dir is not None else None
        # an unknown locale refuses every item (`_probe_settings`); prices are not formatted in it
        locale = self._brand.locale
        self._locale = locale if locale is not None and known_locale(locale) else None
        env = environment(self._template_dir, self._brand)
        # Loaded once, here: a missing template is a deployment error, not a per-item failure.
        self._templates = {name: load(env, name, self._template_dir) for name in _TEMPLATES}
        html_pick, text_pick = (load(env, name, self._template_dir) for name in _PICK_TEMPLATES)
        self._pick_html = lru_cache(maxsize=_PICK_BLOCKS_KEPT)(
            lambda pick: html_pick.render(pick=pick)
        )
        self._pick_text = lru_cache(maxsize=_PICK_BLOCKS_KEPT)(
            lambda pick, number: text_pick.render(pick=pick, number=number)
        )
        # Each template's globals merged once: `render` merges them (a ChainMap walk) per call,
        # and a context walks them again for their names unless they are a plain dict.
        self._globals = {name: dict(t.globals) for name, t in self._templates.items()}
        for name, template in self._templates.items():
            template.globals = self._globals[name]
        self._sender = sender
        self._domain = sender_domain(sender)
        # Formatted once here so a template with unknown fields fails at startup, not per item.
        unsubscribe_url.format(customer_id="c", token="t")
        self._unsubscribe_url = unsubscribe_url
        self._secret = unsubscribe_secret
        self._sign = token_signer(unsubscribe_secret)
        self._id_key = message_id_key(unsubscribe_secret)
        self._clock = clock
        self._postal_address = postal_address
        self._message_id_domain = message_id_domain  # None: the sender's domain
        self._settings_refused = self._probe_settings()
        check_templates(self, self._template_dir)

    @property
    def unsubscribe_secret(self) -> str:
        return self._secret

    @property
    def compliance(self) -> Compliance:
        """The unsubscribe link template and postal address every digest carries."""
        return Compliance(self._unsubscribe_url, self._postal_address)

    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        key = item.key
        if self._settings_refused:
            raise RenderError(f"{key}: {self._settings_refused}")
        if not _is_single_address(recipient):
            raise InvalidRecipient(f"{key}: recipient is not a single address")
        if not rows:
            raise RenderError(f"{key}: no digest rows")
        now = self._clock.now()
        if now.utcoffset() != timedelta(0):
            raise RenderError(f"{key}: the clock is not timezone-aware UTC")
        context = self.template_context(item, rows)
        try:
            subject, text, html = self.render_parts(context)
        except jinja2.TemplateError as e:
            raise RenderError(f"{key}: template failed ({type(e).__name__})") from e
        message = Message(
            key=key,
            recipient=recipient,
            sender=self._sender,
            subject=subject,
            text=text,
            html=html,
            headers=digest_headers(
                key, context["unsubscribe_url"], now, self._domain, self._message_id(key)
            ),
        )
        # Only the cheap checks: serialising here costs several times the rendering,
        # and every mailer that serialises does so anyway, before anything leaves, turning a
        # refusal into a permanent `render_error`. The parts need no check of their own: every
        # value they hold was checked as it came in (a pick's fields once a product, the name
        # here, the shop's name at startup) and the templates are read as UTF-8.
        check_headers(message)
        return message

    def render_parts(self, context: dict[str, Any]) -> tuple[str, str, str]:
        """The subject line, text part and HTML part of `context` (the preheader goes into it)."""
        subject = _one_line(self._render("subject.txt.j2", context), _SUBJECT_MAX)
        context["preheader"] = _one_line(self._render("preheader.txt.j2", context), 140)
        return (
            subject,
            self._render("digest.txt.j2", context),
            self._render("digest.html.j2", context),
        )

    def template_context(self, item: WorkItem, rows: Sequence[DigestRow]) -> dict[str, Any]:
        """What the templates are rendered with, but the preheader (rendered from it first).

        RenderError names a row that cannot be shown.
        """
        key = item.key
        ordered = sorted(rows, key=lambda r: r.position)
        picks = [pick_of(key, row, self._locale) for row in ordered]
        names = (r.payload.get("customer_name") for r in ordered)
        customer_name = next((_one_line(str(n)) for n in names if n), "")
        if not encodable(customer_name):
            raise RenderError(f"{key}: the customer name is not valid Unicode")
        return {
            "picks": picks,
            # Jinja2's `map(attribute=…)` filter cost the preheader more than all the rest of it
            "pick_titles": [p.title for p in picks],
            "pick_blocks": self.pick_blocks(picks),
            "customer_name": customer_name,
            "shop_name": self._brand.shop_name,
            "period_label": f"week {item.period.week}, {item.period.year}",
            "unsubscribe_url": self._unsubscribe(key.customer_id),
            "postal_address": self._postal_address or DEMO_POSTAL_ADDRESS,
        }

    def pick_blocks(self, picks: Sequence[_Pick]) -> _PickBlocks:
        """Each part's blocks of `picks`, in order, from the pick templates (cached per pick).

        The last block's closing newline is the digest template's own, after `pick_blocks`.
        """
        html = [self._pick_html(p) for p in picks]
        text = [self._pick_text(p, n) for n, p in enumerate(picks, 1)]
        if picks:
            # only the last block's newline goes, not a copy of the whole part without it
            html[-1], text[-1] = html[-1].removesuffix("\n"), text[-1].removesuffix("\n")
        return _PickBlocks(markupsafe.Markup("".join(html)), "".join(text))

    def recipe(self) -> Callable[[], Composer] | None:
        clock = recipe_of(self._clock)
        if clock is None:
            return None
        return partial(
            _composer,
            self._sender,
            self._unsubscribe_url,
            self._secret,
            self._brand,
            clock,
            self._postal_address,
            self._message_id_domain,
            self._template_dir,
        )

    @property
    def templates(self) -> Mapping[str, jinja2.Template]:
        """The loaded templates by file name (the compose benchmark renders them alone)."""
        return MappingProxyType(self._templates)

    def _render(self, name: str, context: dict[str, Any]) -> str:
        # `Template.render` without its per-call merge of the globals: a shared context is the
        # dict given, here the globals merged once with this item's values.
        template = self._templates[name]
        ctx = template.new_context(self._globals[name] | context, shared=True)
        return "".join(template.root_render_func(ctx))

    def _message_id(self, key: OperationKey) -> str:
        domain = self._message_id_domain or self._domain or _NO_DOMAIN
        return keyed_message_id(key, self._id_key, domain)

    def _unsubscribe(self, customer_id: str) -> str:
        return self._unsubscribe_url.format(
            customer_id=quote(customer_id, safe=""),
            token=self._sign(customer_id),
        )

    def _probe_settings(self) -> str | None:
        """Why a setting every message holds (sender, link, names, address) cannot be, if so.

        The shop's name and the postal address are in the parts, which compose does not check
        per message; a composer made without the settings (a test's, a benchmark's) has the
        postal address and Message-ID domain checked as `load_settings` checks them. The others
        are the same for every item, and the other per-item header parts (customer id, token,
        Message-ID digest, date, week) come from fixed alphabets, so one serialisation at the
        longest customer id answers for every message; To and Subject are checked per item.
        """
        if not encodable(self._brand.shop_name):
            return "the shop name is not valid Unicode"
        if (problem := brand_problem(self._brand)) is not None:
            return problem
        if self._brand.locale is not None and self._locale is None:
            return "the locale is not one Babel knows"
        for name, value, check in (
            ("postal address", self._postal_address, postal_address),
            ("Message-ID domain", self._message_id_domain, message_id_domain),
        ):
            if value is not None and not _passes(check, value):
                return f"the {name} is not what its setting accepts"
        unsubscribe = self._unsubscribe(_PROBE_KEY.customer_id)
        probe_time = datetime(2026, 1, 5, tzinfo=UTC)
        message_id = self._message_id(_PROBE_KEY)
        headers = digest_headers(_PROBE_KEY, unsubscribe, probe_time, self._domain, message_id)
        probe = Message(_PROBE_KEY, "probe@example.invalid", self._sender, "p", "p", None, headers)
        try:
            to_bytes(probe)
        except RenderError:
            # Each item then fails as it did when compose serialised every message.
            return "the sender or the unsubscribe link cannot be serialised"
        if self._domain is None:
            return "the sender's domain cannot name the list (List-Id, Feedback-ID)"
        return None


def _passes(check: Callable[[str], str], value: str) -> bool:
    try:
        check(value)
    except ValueError:
        return False
    return True


def _composer(
    sender: str,
    url: str,
    secret: str,
    brand: Brand,
    clock: Callable[[], Clock],
    postal: str | None,
    id_domain: str | None,
    template_dir: Path | None,
) -> Jinja2Composer:
    """`Jinja2Composer.recipe`'s call: the same composer, on a clock made in this process.

    The shop's templates are read and checked again in this process, as at any start.
    """
    return Jinja2Composer(
        sender=sender,
        unsubscribe_url=url,
        unsubscribe_secret=secret,
        clock=clock(),
        postal_address=postal,
        message_id_domain=id_domain,
        brand=brand,
        template_dir=template_dir,
    )
