"""The grid's outputs: a table for the terminal, JSON, CSV and an optional plot.

The table is the DataFrame turned on its side (one column per cell), because a cell has about
sixty numbers and a terminal is wider than it is tall only up to a point. Every output is a
function of the frame alone, so the same seed writes the same bytes.
"""

import importlib
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from digest_pipeline.rigs.sim.config import InvalidSimulation, SimConfig

#: what `--plot` draws, one panel each: (column, title)
PLOTTED = (
    ("duplicate_extra", "extra provider deliveries"),
    ("drain_s", "virtual seconds to drain"),
    ("max_retry_wakes_per_s", "most retries due in one second"),
)


def _text(value: Any) -> str:
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _plain(value: Any) -> Any:
    """A JSON value: numpy scalars as Python ones, NaN as null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as plain dictionaries, columns in order."""
    return [
        {column: _plain(value) for column, value in zip(frame.columns, row, strict=True)}
        for row in frame.itertuples(index=False, name=None)
    ]


def render_table(frame: pd.DataFrame) -> str:
    """One row per metric, one column per cell."""
    rows = records(frame)
    table = pd.DataFrame(
        {str(r["cell"]): [_text(r[c]) for c in frame.columns[1:]] for r in rows},
        index=list(frame.columns[1:]),
    )
    return table.to_string()


def render_header(config: SimConfig) -> list[str]:
    """What was simulated, in three lines above the table."""
    d = config.describe()
    return [
        f"{d['customers']} customers, seed {d['seed']}, period {d['period']} delivered from "
        f"{d['start']}",
        f"faults: transient {d['transient_rate']:g}, throttled {d['throttle_rate']:g}, permanent "
        f"{d['permanent_rate']:g}, timeout-after-accept {d['timeout_after_accept_rate']:g}, "
        f"crash-after-send {d['crash_after_send_rate']:g}, crash-after-cleanup-commit "
        f"{d['crash_after_cleanup_commit_rate']:g}, duplicate-delivery "
        f"{d['duplicate_delivery_rate']:g}; outage {d['outage_min']:g} min from minute "
        f"{d['outage_start_min']:g}; provider "
        f"{'idempotent' if d['provider_idempotent'] else 'not idempotent'}; "
        f"send latency {d['send_latency_ms']:g} ms",
        f"bounds: retry base {d['retry_base_s']:g} s, cap {d['retry_cap_s']:g} s, max attempts "
        f"{d['max_attempts']}, max age {d['max_age_s']:g} s; batch {d['batch_size']}; sweep "
        f"every {d['sweep_s']:g} s",
    ]


def write_json(frame: pd.DataFrame, config: SimConfig, path: Path) -> None:
    """`{"config": inputs, "cells": one record per cell}`."""
    data = {"config": config.describe(), "cells": records(frame)}
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """One line per cell, the columns in order."""
    path.write_text(frame.to_csv(index=False, lineterminator="\n"), encoding="utf-8")


def require_plotting() -> None:
    """`--plot` needs the optional `plot` extra; say so before any cell runs."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InvalidSimulation(
            "--plot needs matplotlib, which is not installed: pip install 'digest_pipeline[plot]'"
        )


def write_plot(frame: pd.DataFrame, path: Path) -> None:
    """Duplicates, drain time and retry-wake spikes across the grid, jitter on and off."""
    require_plotting()
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")
    figure, axes = pyplot.subplots(len(PLOTTED), 1, figsize=(10, 3 * len(PLOTTED)), sharex=True)
    labels = [str(c) for c in frame["cell"]]
    colours = ["tab:blue" if j else "tab:orange" for j in frame["jitter"]]
    for ax, (column, title) in zip(axes, PLOTTED, strict=True):
        values = [0.0 if v is None else float(v) for v in (_plain(x) for x in frame[column])]
        ax.bar(labels, values, color=colours)
        ax.set_ylim(0, max([*values, 1.0]) * 1.1)
        ax.set_title(title + "  (blue: jitter, orange: no jitter)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].tick_params(axis="x", labelrotation=45)
    figure.tight_layout()
    figure.savefig(path, format="png", metadata={"Software": None})
    pyplot.close(figure)
