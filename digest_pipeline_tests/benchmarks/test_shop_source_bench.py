"""The shop-source benchmark at a toy size: both sources freeze the same week and write it."""

import json

from benchmarks import shop_source


def test_the_mapped_shop_freezes_and_writes_what_the_demo_tables_do(tmp_path):
    shop_source.run(shop_source.Options(customers=150, json_dir=tmp_path))

    data = json.loads((tmp_path / "shop_source.json").read_text(encoding="utf-8"))
    rows = {r["source"]: r for r in data["rows"]}
    assert set(rows) == set(shop_source.SOURCES)
    assert rows["mapped"]["eligible"] == rows["default"]["eligible"] > 0
    assert rows["mapped"]["rows"] == rows["default"]["rows"] > 0
    assert all(r["same"] for r in rows.values())
    assert {"build_s", "snapshot_s", "content_s", "rss_mb"} <= rows["mapped"].keys()
