"""How a benchmark reports: its table on stdout, its JSON beside the others, its verdict columns."""

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.2f}"
    return str(value)


def accounted_cell(verdict: Mapping[str, Any]) -> str:
    """`ok`, or the states of a week whose items are not all accounted for (`ledger_verdict`)."""
    return "ok" if verdict["accounted"] else f"FAIL {verdict['states']}"


#: the cells `verdicts` makes, in the order the tables show them
VERDICT_COLUMNS = ("accounted", "dup_sends", "checks")


def sent_twice(m: Mapping[str, Any]) -> int:
    """Duplicate sends: the mailer's count, where it has one, plus the ledger's double sends."""
    return int((m["mailer_dup_sends"] or 0) + m["ledger_double_sends"])


def verdicts(m: Mapping[str, Any]) -> dict[str, Any]:
    """A measured run's verdicts as table cells: every item accounted for, duplicate sends (the
    mailer's count, where it has one, plus the ledger's) and the job's checks passed."""
    failed = m.get("failed_checks") or []
    return {
        "accounted": accounted_cell(m),
        # the outbox cannot hold two files of one key, so there the ledger is the only witness
        "dup_sends": sent_twice(m),
        "checks": f"{m['checks_passed']}/{m['checks_total']}"
        + (f" FAILED {','.join(failed)}" if failed else ""),
    }


def print_table(title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """A titled, right-aligned table of the given columns (missing values shown as `-`)."""
    print(f"\n{title}")
    if not rows:
        print("  (no rows)")
        return
    frame = pd.DataFrame([[_cell(r.get(c)) for c in columns] for r in rows], columns=list(columns))
    print(frame.to_string(index=False))
    sys.stdout.flush()


def write_json(json_dir: Path, name: str, payload: Mapping[str, Any]) -> Path:
    """Writes `<json_dir>/<name>.json`, stamped with the time and the machine's core count."""
    json_dir.mkdir(parents=True, exist_ok=True)
    path = json_dir / f"{name}.json"
    stamped = {"benchmark": name, "at": datetime.now(UTC).isoformat(), "cpus": os.cpu_count()}
    path.write_text(
        json.dumps({**stamped, **payload}, indent=2, sort_keys=True, default=str) + "\n",
        encoding="utf-8",
    )
    return path


def publish(name: str, rows: list[dict[str, Any]], opts: Any, **extra: Any) -> dict[str, Any]:
    """Writes a benchmark's rows, options (a dataclass with `json_dir`) and extras as its JSON."""
    payload = {
        "rows": rows,
        **extra,
        "options": {**vars(opts), "json_dir": str(opts.json_dir)},
    }
    write_json(opts.json_dir, name, payload)
    return payload


def int_list(text: str) -> list[int]:
    """`10000,100000` or `10_000` → [10000, 100000] (for argparse)."""
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def str_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
