"""The rendered digests, byte for byte: what the templates made before each pick's block was cached.

`data/rendered_digests.json` was written by the composer that rendered every pick inside the
digest templates' own loops. Each pick's block now comes from `pick.html.j2` / `pick.txt.j2`,
rendered once per pick and reused, and every message must still come out exactly the same. A
deliberate change to the templates rewrites the file: run this module with `REWRITE_GOLDEN=1`.
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest

from digest_pipeline_tests.adapters.test_render import RECIPIENT, composer, item_for, picks, product

GOLDEN = Path(__file__).parent / "data" / "rendered_digests.json"
CASES: dict[str, tuple[list[dict[str, Any]], str]] = {
    "four_picks_named": (
        [product(1, customer_name="Ada"), product(2), product(3), product(4)],
        "customer-0001",
    ),
    "no_image_no_price": (
        [product(1, image_url=None, price=None), product(2, image_url="")],
        "customer-0002",
    ),
    "escaped": (
        [
            product(1, title='Board <b>"oak"</b> & co', url="https://shop.example/p/1?a=1&b=2"),
            product(2, currency="USD"),
        ],
        "customer-0003",
    ),
    "one_pick_unicode": (
        [
            product(
                7,
                title="Schneidebrett aus Nussbaum \u2013 geölt",  # an en dash
                customer_name="Zoë Ünal",
                currency="GBP",
            )
        ],
        "customer-x_9",
    ),
}


def rendered(name: str, shared: Any = None) -> dict[str, str | None]:
    payloads, customer_id = CASES[name]
    item = item_for(customer_id)
    m = (shared or composer()).compose(item, RECIPIENT, picks(item.key, *payloads))
    return {"subject": m.subject, "text": m.text, "html": m.html}


def test_the_golden_file_names_every_case():
    if os.environ.get("REWRITE_GOLDEN") == "1":
        text = json.dumps({n: rendered(n) for n in CASES}, indent=1, ensure_ascii=False)
        GOLDEN.write_text(text, encoding="utf-8")
    assert set(json.loads(GOLDEN.read_text(encoding="utf-8"))) == set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_every_digest_renders_as_it_did(name):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))[name]
    assert rendered(name) == golden


def test_a_pick_block_served_from_the_cache_is_the_block_rendered_first():
    # one composer for every case, twice over: blocks cached by one message show in the next
    # (the same product at another position, in another customer's digest) exactly as rendered
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    shared = composer()
    for _ in range(2):
        for name in CASES:
            assert rendered(name, shared) == golden[name]
