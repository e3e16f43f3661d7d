"""Realistic demo source data (customers, catalogue, orders) for `make demo` and the tests.

Everything follows from `seed` and `now`, and rows are inserted with `ON CONFLICT DO NOTHING`, so
seeding again with the same arguments changes nothing. Every address uses a reserved domain
(RFC 2606); a few are deliberately malformed so the permanent failure path shows. The ledger is
marked as holding demo data (`demo_marker`), which alone lets the public demo secret be used; a
ledger with a shop's data or work and no such mark is refused, with nothing written.
"""

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.demo_marker import mark_demo_data, require_demo_or_empty
from digest_pipeline.adapters.sql.engine import migrate
from digest_pipeline.adapters.sql.schema import customers as customers_table
from digest_pipeline.adapters.sql.schema import orders as orders_table
from digest_pipeline.adapters.sql.schema import products as products_table
from digest_pipeline.domain.periods import Period

#: rows per INSERT batch: large enough to amortise round trips, small enough to bound memory
CHUNK = 5_000
#: how far back each customer's orders go (matches the content service's default look-back)
ORDER_HISTORY = timedelta(weeks=12)
MAX_ORDERS = 8
NEW_ARRIVALS = 6
#: cumulative thresholds of one draw per customer; the three groups do not overlap
P_INACTIVE, P_NOT_OPTED_IN, P_INVALID = 0.05, 0.15, 0.18
DOMAINS = ("example.com", "example.org", "example.net")
CURRENCY = "EUR"

# category -> (price range in cents, titles)
CATALOGUE: dict[str, tuple[tuple[int, int], tuple[str, ...]]] = {
    "Kitchen": (
        (900, 14_900),
        (
            "Cast Iron Skillet 26 cm",
            "Chef's Knife 20 cm",
            "Walnut Cutting Board",
            "Enamelled Dutch Oven 4 L",
            "Stainless Mixing Bowls, Set of 3",
            "Silicone Baking Mat",
            "Digital Kitchen Scale",
            "Linen Tea Towels, Pair",
        ),
    ),
    "Garden": (
        (700, 8_900),
        (
            "Ash-Handled Hand Trowel",
            "Galvanised Watering Can 9 L",
            "Bypass Pruning Shears",
            "Heirloom Tomato Seed Collection",
            "Terracotta Planter 30 cm",
            "Kneeling Pad",
            "Cedar Raised Bed Kit",
        ),
    ),
    "Books": (
        (800, 4_500),
        (
            "The Slow Kitchen: Weeknight Recipes",
            "A Field Guide to Garden Birds",
            "Small Spaces, Big Gardens",
            "The Coffee Atlas",
            "Weekend Hikes Within Two Hours",
            "Bread Every Day",
            "The Quiet Desk: Working Well at Home",
            "Stories for Rainy Afternoons",
        ),
    ),
    "Outdoor": (
        (1_500, 24_900),
        (
            "Insulated Steel Bottle 750 ml",
            "Two-Person Dome Tent",
            "Packable Rain Jacket",
            "Camping Stove with Windscreen",
            "Merino Hiking Socks, 3 Pairs",
            "LED Head Torch",
            "Folding Camp Chair",
        ),
    ),
    "Home Office": (
        (1_200, 39_900),
        (
            "Oak Monitor Stand",
            "Ergonomic Wireless Mouse",
            "Felt Desk Mat",
            "Adjustable Laptop Stand",
            "Dotted A5 Notebook, Pack of 2",
            "Brass Desk Lamp",
            "Cable Organiser Box",
            "Mesh Task Chair",
        ),
    ),
    "Toys": (
        (600, 7_900),
        (
            "Wooden Stacking Rainbow",
            "Marble Run Starter Set",
            "Plush Fox",
            "Magnetic Tile Set, 60 Pieces",
            "Family Card Game",
            "Balance Board",
            "Watercolour Paint Set",
        ),
    ),
    "Bath": (
        (500, 6_900),
        (
            "Waffle Cotton Bath Towel",
            "Lavender Bath Salts 500 g",
            "Bamboo Bath Caddy",
            "Olive Oil Soap, Set of 4",
            "Turkish Cotton Bathrobe",
            "Natural Loofah Sponge",
            "Eucalyptus Shower Steamers",
        ),
    ),
    "Coffee & Tea": (
        (600, 18_900),
        (
            "Single-Origin Espresso Beans 1 kg",
            "Ceramic Pour-Over Dripper",
            "Gooseneck Kettle 1 L",
            "Loose-Leaf Sencha 100 g",
            "Burr Coffee Grinder",
            "Glass Teapot with Infuser",
            "Stoneware Mugs, Set of 2",
            "Chai Spice Blend 250 g",
        ),
    ),
}

FIRST_NAMES = (
    "ada", "alex", "amara", "ben", "carla", "chen", "dana", "elif", "emma", "farah", "felix",
    "grace", "hana", "hugo", "ines", "ivan", "jonas", "julia", "kai", "lena", "leo", "lucia",
    "maya", "milan", "nadia", "noah", "olga", "omar", "paula", "priya", "rafael", "rosa",
    "sam", "sofia", "tariq", "tom", "uma", "vera", "yusuf", "zoe",
)  # fmt: skip
LAST_NAMES = (
    "andersen", "bauer", "costa", "dubois", "eriksen", "fischer", "garcia", "haddad", "ito",
    "jansen", "kowalski", "laurent", "moreau", "nakamura", "novak", "okafor", "petrov", "quinn",
    "rossi", "schmidt", "silva", "tanaka", "varga", "weber", "yilmaz", "zhang",
)  # fmt: skip


@dataclass(frozen=True)
class SeedReport:
    """The generated dataset; the same whether or not its rows were already there."""

    customers: int
    products: int
    orders: int
    inactive: int
    not_opted_in: int
    #: active, opted-in customers whose address the composer refuses (a permanent failure)
    invalid_addresses: int


@dataclass(frozen=True)
class _Product:
    row: dict[str, Any]
    category: str
    weight: float


def _when(base: datetime, rng: random.Random, span: timedelta) -> datetime:
    """A whole second in `[base, base + span)`: whole seconds survive every database exactly."""
    return base + timedelta(seconds=rng.randrange(int(span.total_seconds())))


def _catalogue(rng: random.Random, now: datetime) -> list[_Product]:
    last_week = Period.of((now - timedelta(days=7)).date())
    size = sum(len(titles) for _, titles in CATALOGUE.values())
    # the new arrivals of the most recent complete week, the week `make demo` delivers
    fresh = set(rng.sample(range(1, size + 1), NEW_ARRIVALS))
    made: list[_Product] = []
    for category, ((low, high), titles) in CATALOGUE.items():
        for title in titles:
            n = len(made) + 1
            product_id = f"prod-{n:04d}"
            # shop prices end in .99, .50 or .00
            cents = rng.randrange(low // 100, high // 100) * 100 + rng.choice((99, 50, 0))
            image = f"https://shop.example/img/{product_id}.jpg" if rng.random() >= 0.1 else None
            created_at = (
                _when(last_week.starts_at, rng, timedelta(days=7))
                if n in fresh
                else now - timedelta(days=100 + rng.randrange(800))
            )
            row = {
                "product_id": product_id,
                "title": title,
                "category": category,
                "price_cents": cents,
                "currency": CURRENCY,
                "url": f"https://shop.example/p/{product_id}",
                "image_url": image,
                "created_at": created_at,
            }
            # a long-tailed popularity, so some products are clear best sellers
            made.append(_Product(row, category, rng.paretovariate(1.2)))
    return made


def _email(rng: random.Random, n: int, invalid: bool) -> str:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    local = rng.choice((f"{first}.{last}", f"{first}{last}", f"{first[0]}.{last}", first))
    local, domain = f"{local}.{n:04d}", rng.choice(DOMAINS)
    if not invalid:
        return f"{local}@{domain}"
    # typos people really make, each refused by the composer's address check
    return rng.choice(
        (
            f"{local}.{domain}",  # no @
            f"{local}@@{domain}",  # doubled @
            f"{local}@{domain}.",  # trailing dot
            f"{first} {last}.{n:04d}@{domain}",  # a space
            f"{local}@{domain.replace('.', ',')}",  # comma for dot
            f"{first}..{last}.{n:04d}@{domain}",  # doubled dot
        )
    )


@dataclass
class _Counts:
    orders: int = 0
    inactive: int = 0
    not_opted_in: int = 0
    invalid: int = 0


def _customers(
    rng: random.Random, count: int, now: datetime, catalogue: Sequence[_Product], tally: _Counts
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    by_category: dict[str, list[_Product]] = {}
    for p in catalogue:
        by_category.setdefault(p.category, []).append(p)
    categories = list(by_category)
    start = now - ORDER_HISTORY
    # One stream, one customer after another: seeding more customers later keeps the first ones.
    for n in range(1, count + 1):
        customer_id = f"customer-{n:04d}"
        draw = rng.random()
        active, opted_in = draw >= P_INACTIVE, draw >= P_NOT_OPTED_IN
        invalid = P_NOT_OPTED_IN <= draw < P_INVALID
        tally.inactive += int(not active)
        tally.not_opted_in += int(active and not opted_in)
        tally.invalid += int(invalid)
        customer = {
            "customer_id": customer_id,
            "email": _email(rng, n, invalid),
            "active": active,
            "opted_in": opted_in if active else rng.random() < 0.7,
            "created_at": now - timedelta(days=14 + rng.randrange(1500)),
        }
        lines: list[dict[str, Any]] = []
        favourites = rng.sample(categories, 2)
        for number in range(1, (rng.randint(0, MAX_ORDERS) if active else 0) + 1):
            ordered_at = _when(start, rng, ORDER_HISTORY)
            category = rng.choice(favourites) if rng.random() < 0.75 else rng.choice(categories)
            # nobody buys a product before the shop lists it
            on_sale = [p for p in by_category[category] if p.row["created_at"] <= ordered_at]
            if not on_sale:
                continue
            product = rng.choices(on_sale, weights=[p.weight for p in on_sale])[0]
            lines.append(
                {
                    "order_id": f"order-{n:04d}-{number}",
                    "customer_id": customer_id,
                    "product_id": product.row["product_id"],
                    "ordered_at": ordered_at,
                }
            )
        tally.orders += len(lines)
        yield customer, lines


def _insert_ignoring_existing(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(table).on_conflict_do_nothing(), rows)


def seed_demo(engine: Engine, *, customers: int, seed: int, now: datetime) -> SeedReport:
    """Migrates the database, then inserts the demo dataset for `seed` and `now` (idempotent).

    Args:
        engine: the ledger database; its source tables receive the data.
        customers: how many customers (`customer-0001`, …) to create.
        seed: the random seed; the same seed and `now` give the same rows.
        now: the moment the data is "as of": orders fall in the 12 weeks before it, and a few
            products are new in the complete week before the one that contains it.

    Raises:
        RealLedgerRefused: the ledger holds a shop's data or work and no demo mark.
    """
    if customers < 0:
        raise ValueError(f"customers must not be negative, got {customers}")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    # whole UTC seconds, so every generated time round-trips exactly through both databases
    now = now.astimezone(UTC).replace(microsecond=0)
    migrate(engine)
    rng = random.Random(seed)
    catalogue = _catalogue(rng, now)
    tally = _Counts()
    generated = _customers(rng, customers, now, catalogue, tally)
    with engine.begin() as conn:
        # a real shop's ledger is refused before anything is written (RealLedgerRefused)
        require_demo_or_empty(conn)
        mark_demo_data(conn, now)
        _insert_ignoring_existing(conn, products_table, [p.row for p in catalogue])
        while batch := list(islice(generated, CHUNK)):
            _insert_ignoring_existing(conn, customers_table, [c for c, _ in batch])
            _insert_ignoring_existing(conn, orders_table, [o for _, lines in batch for o in lines])
    if engine.dialect.name == "postgresql":
        # A bulk load leaves the planner without statistics until autovacuum comes by; a shop's
        # long-lived source tables have them, and without them PostgreSQL reads a week's orders
        # through a bitmap of the whole order window, many times the cost of an index lookup.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in (products_table, customers_table, orders_table):
                conn.exec_driver_sql(f"ANALYZE {table.name}")
    return SeedReport(
        customers=customers,
        products=len(catalogue),
        orders=tally.orders,
        inactive=tally.inactive,
        not_opted_in=tally.not_opted_in,
        invalid_addresses=tally.invalid,
    )
