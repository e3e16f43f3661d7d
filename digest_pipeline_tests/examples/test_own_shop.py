"""The example adopter, run as a new user runs it: `examples/own_shop/run.sh` from scratch.

Its week is delivered whole through the shop's own code location, with the shop's schema,
template and brand, and the digest leaves the shop's database as it found it and copies none of
its rows into the ledger. Its second digest instance delivers the same week into its own ledger
and outbox under its own operation keys, and neither ledger serves the other instance.
"""

import email
import json
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from email.header import decode_header, make_header
from pathlib import Path

import pytest

from digest_pipeline_tests.conftest import hermetic_environ

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_shop"
SHOP_TABLES = ("users", "catalog_items", "purchases")
VIP = "vip_digest"
_EXPORTED = re.compile(r'^declare -x ([A-Z_]+)="(.*)"$', re.MULTILINE)


def _dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in SHOP_TABLES}


def _status(out: str) -> dict[str, object]:
    """The run's last output: `digest status --json`, the lines from the one that opens it."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    status: dict[str, object] = json.loads("\n".join(lines[start:]))
    return status


@dataclass(frozen=True)
class Built:
    """The example after `run.sh`: its folder of files, its last output, its settings."""

    work: Path
    stdout: str
    env: dict[str, str]

    def digest(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`digest ARGS` in the example's folder, with the settings `run.sh` used."""
        return subprocess.run(
            [str(Path(sys.prefix) / "bin" / "digest"), *args],
            cwd=EXAMPLE,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("own_shop") / "work"
    env = {**hermetic_environ(), "OWN_SHOP_WORK": str(work), "VENV": sys.prefix}
    done = subprocess.run(
        ["bash", str(EXAMPLE / "run.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the settings run.sh wrote for `dagster dev`: `declare -x NAME="value"` lines
    exported = dict(_EXPORTED.findall((work / "env").read_text(encoding="utf-8")))
    return Built(work, done.stdout, {**env, **exported})


def _keys(ledger: Path) -> list[str]:
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
        return [k for (k,) in db.execute("SELECT operation_key FROM work_items")]


def test_the_example_shop_delivers_its_week_from_its_own_schema_and_copies_nothing(built, tmp_path):
    work = built.work
    status = _status(built.stdout)
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


def test_the_second_instance_delivers_the_week_under_its_own_keys_ledger_and_outbox(built):
    first = sorted(_keys(built.work / "ledger.db"))

    done = built.digest("--instance", "vip_digest", "run", "--period", "latest")

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    vip = sorted(_keys(built.work / "vip_ledger.db"))
    assert len(vip) == len(first) > 0
    assert all(k.startswith("vip_digest:") for k in vip)
    # the same customers and week, each under the other instance's name
    assert [k.removeprefix("vip_digest:") for k in vip] == [
        k.removeprefix("digest:") for k in first
    ]
    assert sorted(_keys(built.work / "ledger.db")) == first  # the first's ledger is untouched
    sent = sorted(p.name for p in (built.work / "vip_outbox" / "new").iterdir())
    assert len(sent) == len(vip)
    assert all(name.startswith("vip_digest_") for name in sent)
    for path in (built.work / "vip_outbox" / "new").iterdir():
        message = email.message_from_bytes(path.read_bytes())
        assert str(make_header(decode_header(message["Subject"]))).startswith("Nordic Goods Club")


def test_a_ledger_refuses_a_process_of_another_instance_and_nothing_changes(built):
    ledger = built.work / "ledger.db"  # the first instance's, `digest`
    before = ledger.read_bytes()
    env = {**built.env, "DIGEST_DATABASE_URL": f"sqlite:///{ledger}", "DIGEST_INSTANCE": VIP}

    done = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "digest"), "status", "--period", "latest"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "'digest'" in line or " digest " in line, line
    assert VIP in line, line
    assert ledger.read_bytes() == before


def test_an_instance_the_code_location_lacks_is_one_line_naming_those_it_has(built):
    done = built.digest("--instance", "weekly", "status", "--period", "latest")

    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "digest status: error: the code location of workspace.yaml has no digest instance "
        "weekly (found: digest, vip_digest)"
    ]
