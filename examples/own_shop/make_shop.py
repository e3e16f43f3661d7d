"""Builds the example shop's own database: a schema of its own, nothing like the digest's tables.

`users(id, mail, marketing_consent, deleted_at)`, `catalog_items` and `purchases`, filled with
a deterministic shop whose orders fall in the twelve weeks before the latest complete week.
Run: `python make_shop.py PATH/shop.db` (the file is made anew).
"""

import random
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

USERS, ITEMS, PURCHASES = 40, 24, 240
DEPARTMENTS = ("Kitchen", "Garden", "Outdoor", "Reading")

SCHEMA = """
CREATE TABLE users (
    id INTEGER PRIMARY KEY,
    mail TEXT NOT NULL,
    marketing_consent INTEGER NOT NULL,
    deleted_at TEXT
);
CREATE TABLE catalog_items (
    sku TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    department TEXT NOT NULL,
    price_minor INTEGER NOT NULL,
    currency TEXT NOT NULL,
    link TEXT NOT NULL,
    image TEXT,
    listed_at TEXT NOT NULL
);
CREATE TABLE purchases (
    id INTEGER PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users (id),
    sku TEXT NOT NULL REFERENCES catalog_items (sku),
    purchased_at TEXT NOT NULL
);
"""


def _monday(now: datetime) -> datetime:
    """The start of the current ISO week: the latest complete week ends here."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S")


def build(path: Path, now: datetime) -> None:
    """Writes the shop to a new file at `path`."""
    rand = random.Random(7)
    week_ends = _monday(now)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
        db.executemany(
            "INSERT INTO users VALUES (?, ?, ?, ?)",
            [
                # every seventh user said no to marketing mail, every eleventh left the shop
                (
                    n,
                    f"user{n}@nordic-goods.example",
                    int(n % 7 != 0),
                    None if n % 11 else "2026-01-05",
                )
                for n in range(1, USERS + 1)
            ],
        )
        db.executemany(
            "INSERT INTO catalog_items VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    f"NG-{n:04d}",
                    f"Nordic piece {n}",
                    DEPARTMENTS[n % len(DEPARTMENTS)],
                    990 + 250 * n,
                    "EUR",
                    f"https://nordic-goods.example/p/NG-{n:04d}",
                    None,
                    _iso(week_ends - timedelta(weeks=30 - n)),
                )
                for n in range(1, ITEMS + 1)
            ],
        )
        db.executemany(
            "INSERT INTO purchases VALUES (?, ?, ?, ?)",
            [
                (
                    n,
                    rand.randint(1, USERS),
                    f"NG-{rand.randint(1, ITEMS):04d}",
                    _iso(week_ends - timedelta(minutes=rand.randint(60, 12 * 7 * 24 * 60))),
                )
                for n in range(1, PURCHASES + 1)
            ],
        )


if __name__ == "__main__":
    build(Path(sys.argv[1]), datetime.now(UTC))
