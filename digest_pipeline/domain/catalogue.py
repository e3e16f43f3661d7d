"""What goes into one customer's digest: product picks from the catalogue and recent orders.

The picking rule is pure and deterministic (ties break by product id), so a re-run of a period
chooses the same products and a test can state exactly what a customer should see.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

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
    appears once and never if the customer bought it. Ties break by product id.

    Args:
        bought: the customer's orders in the look-back window.
        products: the catalogue by product id.
        popularity: orders per product id in the look-back window.
        period: the week the digest covers; it defines what counts as a new arrival.
        limit: the most products to return.
    """
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
    owned = {o.product_id for o in bought}
    categories = {products[pid].category for pid in owned if pid in products}
    candidates = sorted(
        (p for p in products.values() if p.product_id not in owned), key=lambda p: p.product_id
    )
    ranked = sorted(candidates, key=lambda p: (-popularity.get(p.product_id, 0), p.product_id))
    in_category = [
        p for p in ranked if p.category in categories and popularity.get(p.product_id, 0) > 0
    ]
    # `candidates` is in id order and a reverse sort is stable, so equal times stay in id order.
    arrivals = sorted(
        (p for p in candidates if period.starts_at <= p.created_at < period.ends_at),
        key=lambda p: p.created_at,
        reverse=True,
    )
    return _first_unique((in_category, arrivals, ranked), limit)


def _first_unique(tiers: Iterable[Iterable[Product]], limit: int) -> list[Product]:
    picks: dict[str, Product] = {}
    for tier in tiers:
        for p in tier:
            if len(picks) == limit:
                return list(picks.values())
            picks.setdefault(p.product_id, p)
    return list(picks.values())


def price_text(cents: int) -> str:
    """`1250` → `"12.50"`: the decimal string the digest row (and the renderer) expects."""
    return f"{Decimal(cents).scaleb(-2):.2f}"


def digest_rows_for(key: OperationKey, picks: Sequence[Product]) -> list[DigestRow]:
    """One digest row per pick, at positions 0..n-1, linked to the customer's operation key."""
    return [
        DigestRow(
            key,
            position,
            {
                "title": p.title,
                "price": price_text(p.price_cents),
                "currency": p.currency,
                "url": p.url,
                "image_url": p.image_url,
                "category": p.category,
                "product_id": p.product_id,
            },
        )
        for position, p in enumerate(picks)
    ]
