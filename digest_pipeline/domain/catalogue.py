"""What goes into one customer's digest: product picks from the catalogue and recent orders.

The picking rule is pure and deterministic (ties break by product id), so a re-run of a period
chooses the same products and a test can state exactly what a customer should see. A product
that cannot become a safe message (`product_problems`) is never picked: one malformed catalogue
row costs that product its place in the digests, never a customer their digest. A shop may
replace the rule (`PicksRule`, `DIGEST_PICKS_RULE`); `checked_picks` holds any rule's answer
to the same catalogue and limit the built-in one keeps.
"""

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.model import DigestRow
from digest_pipeline.domain.periods import OperationKey, Period


@dataclass(frozen=True)
class Product:
    """One catalogue entry, as the shop lists it."""

    product_id: str
    title: str
    category: str
    #: integer minor units, so prices never pass through a float
    price_cents: int
    #: ISO 4217 code, e.g. `EUR`
    currency: str
    url: str
    image_url: str | None
    created_at: datetime


#: the catalogue's column widths (adapters.sql.schema.products): a longer value did not come from there
_ID_MAX, _TITLE_MAX, _URL_MAX = 64, 300, 500
#: a price above this (100 million in major units) is a data error, not a product
MAX_PRICE_CENTS = 10_000_000_000
# C0 and C1 controls, DEL, and the Unicode line and paragraph separators the email package and
# receivers treat as line breaks
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Never in a link: whitespace, quotes (they end an HTML attribute), angle brackets and the
# backslash (browsers read it as `/`) - RFC 3986 does not allow any of them unencoded.
_NOT_IN_URL = re.compile("[\\s\"'<>\\\\`]")
_PLAIN_ID = re.compile(r"[A-Za-z0-9._:/+-]+")
_CURRENCY = re.compile(r"[A-Z]{3}")


@dataclass(frozen=True)
class ProductProblem:
    """A product left out of every digest, by id, with the fields that failed (no values)."""

    #: the product id as `shown_id` prints it
    product_id: str
    #: the failing fields, in `Product`'s field order, e.g. `("image_url",)`
    fields: tuple[str, ...]


def shown_id(product_id: object) -> str:
    """A product id safe to print in a log line, a detail or metadata: plain ids stay as they are.

    Anything else (spaces, quotes, controls, too long) comes out as its `ascii()` form, cut to
    the catalogue's id width, so an id can be reported without carrying what made it bad.
    """
    text = str(product_id)
    if _PLAIN_ID.fullmatch(text) and len(text) <= _ID_MAX:
        return text
    return ascii(text)[:_ID_MAX]


def encodable(text: str) -> bool:
    """Whether UTF-8 can encode `text`; a message cannot carry text that it cannot.

    A lone surrogate from a badly decoded source fails both the wire form and a provider's JSON.
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_ok(value: object, limit: int) -> bool:
    return (
        isinstance(value, str)
        and bool(value.strip())
        and len(value) <= limit
        and not _CONTROL.search(value)
        and encodable(value)
    )


def is_web_link(value: object) -> bool:
    """An absolute `http`/`https` URL with a host, nothing a browser or mail client misreads.

    Refused: other schemes (`javascript:`), relative links, credentials before the host (`https:
    //shop.example@evil.example`), a bad port, whitespace, quotes, `<>`, backslashes, controls.
    """
    if not isinstance(value, str) or not value or len(value) > _URL_MAX:
        return False
    if _NOT_IN_URL.search(value) or _CONTROL.search(value) or not encodable(value):
        return False
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # an unparsable IPv6 host or port
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and "@" not in parts.netloc
        and port_ok
    )


def product_problems(p: Product) -> tuple[str, ...]:
    """The fields of `p` that stop it from being picked; empty for a good product.

    The rules are what the renderer needs to make a safe message of a pick: a plain id, a title
    of one line, web links, a non-negative integer price in an ISO 4217-shaped currency, and a
    timezone-aware creation time (new arrivals are found by comparing it with the week).
    """
    failed = []
    # typed fields, but the values come from another system's rows: check what they really are
    category: object = p.category
    if shown_id(p.product_id) != p.product_id:
        failed.append("product_id")
    if not _text_ok(p.title, _TITLE_MAX):
        failed.append("title")
    if not isinstance(category, str):
        failed.append("category")
    if type(p.price_cents) is not int or not 0 <= p.price_cents <= MAX_PRICE_CENTS:
        failed.append("price_cents")
    if not (isinstance(p.currency, str) and _CURRENCY.fullmatch(p.currency.upper())):
        failed.append("currency")
    if not is_web_link(p.url):
        failed.append("url")
    if p.image_url not in (None, "") and not is_web_link(p.image_url):
        failed.append("image_url")
    if not isinstance(p.created_at, datetime) or p.created_at.utcoffset() is None:
        failed.append("created_at")
    return tuple(failed)


def screen_catalogue(
    products: Iterable[Product],
) -> tuple[dict[str, Product], tuple[ProductProblem, ...]]:
    """The catalogue split into the good products by id and the problems of the others, by id."""
    good: dict[str, Product] = {}
    bad: list[ProductProblem] = []
    for p in products:
        failed = product_problems(p)
        if failed:
            bad.append(ProductProblem(shown_id(p.product_id), failed))
        else:
            good[p.product_id] = p
    return good, tuple(sorted(bad, key=lambda b: b.product_id))


@dataclass(frozen=True)
class Order:
    """One product bought by one customer (an order line; quantities do not matter here)."""

    order_id: str
    customer_id: str
    product_id: str
    ordered_at: datetime


def pick_products(
    bought: Sequence[Order],
    products: Mapping[str, Product],
    popularity: Mapping[str, int],
    period: Period,
    limit: int = 4,
) -> list[Product]:
    """Up to `limit` products for one customer, best first.

    In order: top sellers (products with at least one sale in `popularity`, most sold first) in
    the categories the customer bought from; then new arrivals, created inside the period's week,
    newest first; then the overall ranking by sales (unsold products last) to fill up. A product
    appears once and never if the customer bought it. Ties break by product id. Only good
    products are picked (`product_problems`); a bad one bought still names its category.

    Args:
        bought: the customer's orders in the look-back window.
        products: the catalogue by product id.
        popularity: orders per product id in the look-back window.
        period: the week the digest covers; it defines what counts as a new arrival.
        limit: the most products to return.
    """
    return PickPlan(products, popularity, period).picks(bought, limit)


class PickPlan:
    """`pick_products` with the work that does not depend on the customer done once.

    The catalogue is screened and ranked once per period; each customer then only filters those
    rankings by what they own, and stops as soon as `limit` picks are found. `excluded` names
    the products left out and why.
    """

    def __init__(
        self, products: Mapping[str, Product], popularity: Mapping[str, int], period: Period
    ) -> None:
        good, self.excluded = screen_catalogue(products.values())
        #: the week the plan picks for: what counts as a new arrival
        self.period = period
        #: the screened catalogue by product id, read-only: what a pick may name
        self.catalogue: Mapping[str, Product] = MappingProxyType(good)
        #: order lines per product id in the look-back window, read-only
        self.popularity: Mapping[str, int] = MappingProxyType(popularity)
        by_id = sorted(good.values(), key=lambda p: p.product_id)
        # a category is only matched, never shown, so a bad product's still counts
        self._category = {
            pid: p.category for pid, p in products.items() if isinstance(p.category, str)
        }
        #: one payload a product, shared by every row that picks it: rows are written and read,
        #: never changed, and the SQL ledger then encodes each shared payload once a write
        self.payloads = {pid: row_payload(p) for pid, p in good.items()}
        self._ranked = sorted(by_id, key=lambda p: (-popularity.get(p.product_id, 0), p.product_id))
        self._sold = {pid for pid, n in popularity.items() if n > 0}
        #: the ranking's sold products, the only ones the category tier takes
        self._ranked_sold = [p for p in self._ranked if p.product_id in self._sold]
        starts, ends = period.starts_at, period.ends_at
        # `by_id` is in id order and a reverse sort is stable, so equal times stay in id order.
        self._arrivals = sorted(
            (p for p in by_id if starts <= p.created_at < ends),
            key=lambda p: p.created_at,
            reverse=True,
        )

    def picks(self, bought: Sequence[Order], limit: int = 4) -> list[Product]:
        """Up to `limit` products for one customer, best first (see `pick_products`)."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        owned = {o.product_id for o in bought}
        categories = {self._category[pid] for pid in owned if pid in self._category}
        # Lazy tiers: a customer needs `limit` picks, not the catalogue filtered three times.
        in_category = (
            p for p in self._ranked_sold if p.category in categories and p.product_id not in owned
        )
        arrivals = (p for p in self._arrivals if p.product_id not in owned)
        fresh = (p for p in self._ranked if p.product_id not in owned)
        return _first_unique((in_category, arrivals, fresh), limit)


def _first_unique(tiers: Iterable[Iterable[Product]], limit: int) -> list[Product]:
    picks: dict[str, Product] = {}
    for tier in tiers:
        for p in tier:
            if len(picks) == limit:
                return list(picks.values())
            picks.setdefault(p.product_id, p)
    return list(picks.values())


@dataclass(frozen=True)
class PickRequest:
    """What a picks rule is given for one customer's digest of one week (read-only throughout).

    The customer is named by the frozen row's operation key alone: the period and the customer
    id. The address the snapshot froze beside it is not given: choosing products needs no
    address, and what a rule never holds it cannot log, raise or send anywhere.
    """

    #: `digest:<period>:<customer_id>` of the frozen row
    key: OperationKey
    #: the customer's order lines in the look-back window (every product they bought there)
    bought: tuple[Order, ...]
    #: the most picks the answer may hold
    limit: int
    #: the week's screened catalogue and popularity, and the built-in rule's ranking
    week: PickPlan

    @property
    def customer_id(self) -> str:
        return self.key.customer_id

    @property
    def period(self) -> Period:
        return self.key.period

    @property
    def catalogue(self) -> Mapping[str, Product]:
        """The week's screened products by id: the only products a pick may name."""
        return self.week.catalogue

    @property
    def popularity(self) -> Mapping[str, int]:
        """Order lines per product id in the look-back window, over every customer."""
        return self.week.popularity


#: A picks rule: one customer's picks, best first, as product ids or catalogue `Product`s, in a
#: list or tuple of at most `request.limit`. An empty answer is a digest without picks.
PicksRule = Callable[[PickRequest], Sequence[str | Product]]
#: `DIGEST_PICKS_RULE`'s default: `popular_in_your_categories`, by its import path
DEFAULT_PICKS_RULE = "digest_pipeline.domain.catalogue:popular_in_your_categories"


def popular_in_your_categories(request: PickRequest) -> list[Product]:
    """The built-in picks rule: top sellers in the customer's categories, then new arrivals.

    `pick_products`'s rule, over the ranking the week prepared once (`PickPlan.picks`).
    """
    return request.week.picks(request.bought, request.limit)


class PicksRejected(DigestError):
    """A picks rule's answer for one customer is not picks of this week's catalogue."""


def checked_picks(request: PickRequest, answer: object) -> list[Product]:
    """The rule's `answer` as the catalogue's products, in order.

    Raises:
        PicksRejected: not a list or tuple, more than `request.limit` picks, a pick that is
            neither a product id nor a `Product`, an id the screened catalogue lacks (or a
            `Product` other than the catalogue's), or a product picked twice. The reason names
            positions, types and product ids (`shown_id`), never a product's text.
    """
    if not isinstance(answer, list | tuple):
        raise PicksRejected(f"returned a {type(answer).__name__}, not a list or tuple")
    if len(answer) > request.limit:
        raise PicksRejected(f"returned {len(answer)} picks; at most {request.limit}")
    catalogue = request.catalogue
    picks: dict[str, Product] = {}
    for position, pick in enumerate(answer, 1):
        if isinstance(pick, str):
            named: object = pick
            known = catalogue.get(pick)
        elif isinstance(pick, Product):
            named = pick.product_id
            known = catalogue.get(named) if isinstance(named, str) else None
            # the catalogue's own object (the built-in rule's answer) needs no field comparison
            if known is not None and pick is not known and pick != known:
                known = None
        else:
            raise PicksRejected(f"pick {position} is a {type(pick).__name__}, not a product id")
        if known is None:
            raise PicksRejected(
                f"pick {position} ({shown_id(named)}) is not in the week's screened catalogue"
            )
        if known.product_id in picks:
            raise PicksRejected(f"pick {position} repeats product {known.product_id}")
        picks[known.product_id] = known
    return list(picks.values())


def price_text(cents: int) -> str:
    """`1250` → `"12.50"`: the decimal string the digest row (and the renderer) expects."""
    return f"{Decimal(cents).scaleb(-2):.2f}"


def row_payload(p: Product) -> dict[str, Any]:
    """What a digest row holds of one product: the fields the renderer shows and links."""
    return {
        "title": p.title,
        "price": price_text(p.price_cents),
        "currency": p.currency,
        "url": p.url,
        "image_url": p.image_url,
        "category": p.category,
        "product_id": p.product_id,
    }


def digest_rows_for(
    key: OperationKey,
    picks: Sequence[Product],
    payloads: Mapping[str, dict[str, Any]] | None = None,
) -> list[DigestRow]:
    """One digest row per pick, at positions 0..n-1, linked to the customer's operation key.

    `payloads` may hold products' payloads made already (`PickPlan.payloads`), by product id.
    """
    made = payloads or {}
    return [
        DigestRow(key, position, made.get(p.product_id) or row_payload(p))
        for position, p in enumerate(picks)
    ]
