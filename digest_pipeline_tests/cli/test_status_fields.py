"""`digest status` prints the same figures as `digest status --json`, by the same names.

The asset metadata the UI shows takes its week's figures from the same source
(`PeriodMetrics.as_flat_dict`), so the text, the JSON and the UI agree field for field.
"""

from digest_pipeline.domain.states import DeliveryState

P = "2026-W42"


def rows_of(text: str) -> dict[str, str]:
    """The two-column rows of `digest status`'s tables: first cell → second cell."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 2 and not set(cells[0]) <= {"-"}:
            rows.setdefault(cells[0], " ".join(cells[1:]))
    return rows


def shown(value: object) -> str:
    return "-" if value is None else str(value)


def test_the_text_shows_every_json_figure_with_the_same_value(mixed):
    data = mixed.cli("status", "--period", P, "--json").json()
    text = mixed.cli("status", "--period", P)

    rows = rows_of(text.out)
    week = data["metrics"]
    figures = {k: v for k, v in week.items() if k != "period" and not k.startswith("left_out")}
    assert {k: rows.get(k) for k in figures} == {k: shown(v) for k, v in figures.items()}


def test_every_state_is_counted_and_the_counts_add_up_to_the_work_items(mixed):
    week = mixed.cli("status", "--period", P, "--json").json()["metrics"]

    counts = [week[s.value] for s in DeliveryState]
    assert sum(counts) == week["work_items"] == week["eligible"] > 0
    assert week["failed"] > 0
    assert week["unknown"] > 0


def test_shares_are_rounded_fractions_with_a_text_beside_them(mixed):
    week = mixed.cli("status", "--period", P, "--json").json()["metrics"]

    for name, value in week.items():
        if name.endswith("_fraction") and value is not None:
            assert value == round(value, 4), name
            assert isinstance(week[name.removesuffix("_fraction") + "_pct"], str), name
