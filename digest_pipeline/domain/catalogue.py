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
    return PickPlan(products, popularity, period).picks(bought, limit)


class PickPlan:
    """`pick_products` with the work that does not depend on the customer done once.

    The catalogue is ranked once per period; each customer then only filters those rankings by
    what they own, and stops as soon as `limit` picks are found.
    """

    def __init__(
        self, products: Mapping[str, Product], popularity: Mapping[str, int], period: Period
    ) -> None:
        by_id = sorted(products.values(), key=lambda p: p.product_id)
        self._products = products
        self._ranked = sorted(by_id, key=lambda p: (-popularity.get(p.product_id, 0), p.product_id))
        self._sold = {pid for pid, n in popularity.items() if n > 0}
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
        categories = {self._products[pid].category for pid in owned if pid in self._products}
        fresh = [p for p in self._ranked if p.product_id not in owned]
        in_category = (p for p in fresh if p.category in categories and p.product_id in self._sold)
        arrivals = (p for p in self._arrivals if p.product_id not in owned)
        return _first_unique((in_category, arrivals, fresh), limit)


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
