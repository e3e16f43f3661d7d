"""The example adopter, run as a new user runs it: `examples/own_shop/run.sh` from scratch.

Its week is delivered whole through the shop's own code location, with the shop's schema,
template and brand, and the digest leaves the shop's database as it found it and copies none of
its rows into the ledger.
"""

import email
import json
import re
import sqlite3
import subprocess
import sys
from email.header import decode_header, make_header
from pathlib import Path

from digest_pipeline_tests.conftest import hermetic_environ

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_shop"
SHOP_TABLES = ("users", "catalog_items", "purchases")


def _dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in SHOP_TABLES}


def _status(out: str) -> dict[str, object]:
    """The run's last output: `digest status --json`, the lines from the one that opens it."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    status: dict[str, object] = json.loads("\n".join(lines[start:]))
    return status


def test_the_example_shop_delivers_its_week_from_its_own_schema_and_copies_nothing(tmp_path):
    work = tmp_path / "work"
    env = {**hermetic_environ(), "OWN_SHOP_WORK": str(work), "VENV": sys.prefix}

    done = subprocess.run(
        ["bash", str(EXAMPLE / "run.sh")], env=env, capture_output=True, text=True, timeout=600
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    status = _status(done.stdout)
    metrics = status["metrics"]
    assert isinstance(metrics, dict)
    shop = _dump(work / "shop.db")
    # opted in and not deleted, as the shop's query says
    wanted = sum(1 for _, _, consent, deleted in shop["users"] if consent and deleted is None)
    assert wanted > 0
    assert metrics["eligible"] == metrics["delivered"] == wanted
    assert all(check["passed"] for check in status["invariants"].values())  # type: ignore[attr-defined]

    # the shop's database is read, never written: a fresh build of it is the same
    subprocess.run([sys.executable, str(EXAMPLE / "make_shop.py"), str(tmp_path / "again.db")])
    assert _dump(tmp_path / "again.db") == shop

    # the ledger holds the week's snapshot and items, and no table or row of the shop's
    with sqlite3.connect(work / "ledger.db") as ledger:
        tables = {name for (name,) in ledger.execute("SELECT name FROM sqlite_master")}
        assert tables.isdisjoint(SHOP_TABLES)
        for demo in ("customers", "products", "orders"):
            assert ledger.execute(f"SELECT count(*) FROM {demo}").fetchone() == (0,)

    # the shop's template and brand: its subject line, its German prices
    messages = sorted((work / "outbox" / "new").iterdir())
    assert len(messages) == wanted
    for path in messages:
        message = email.message_from_bytes(path.read_bytes())
        assert str(make_header(decode_header(message["Subject"]))).startswith("Nordic Goods · ")
        text = next(p for p in message.walk() if p.get_content_type() == "text/plain")
        body = text.get_payload(decode=True).decode()  # type: ignore[union-attr]
        assert re.search(r"\d,\d\d\u00a0€\)", body)  # de_DE: a decimal comma, a no-break space
