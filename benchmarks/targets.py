"""The scale targets, judged from the JSON the other benchmarks of the same run wrote.

`make bench` prints this table last, so a run says itself which targets it met, each with the
figure that decides it, instead of a reader working out a ratio or a percentage by hand. A
target whose benchmark did not run in this invocation (`--only`, no PostgreSQL, no `--large`)
is `not measured`, never judged from an older file.
"""

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import common, tables

COLUMNS = ("target", "measured", "verdict")
#: the end-to-end size the throughput, floor and event-row targets are set at
WEEK = 100_000
LARGE = 1_000_000
#: the side-by-side target's week
SIDE = 2_000
LIMIT_S = 30.0
FLOOR_PCT = 40.0
RATIO = 50.0
EVENT_ROWS = 200
RSS_MB = 400.0
SERVER_STATEMENTS = 0.5
#: share of `concurrency / latency` by concurrency: at most 64, then beyond
BOUND_PCT = ((64, 70.0), (None, 50.0))

Payloads = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    #: None when the run measured nothing to judge
    met: bool | None

    def row(self) -> dict[str, str]:
        verdict = "not measured" if self.met is None else "met" if self.met else "NOT met"
        return {"target": self.target, "measured": self.measured, "verdict": verdict}


def load(json_dir: Path, since: datetime | None = None) -> dict[str, dict[str, Any]]:
    """Each benchmark's JSON in `json_dir`, keeping only those written at or after `since`."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(json_dir.glob("*.json")):
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not a benchmark's JSON: {e}") from None
        name = payload.get("benchmark")
        if name is None or name == "targets":
            continue
        if since is not None and datetime.fromisoformat(payload["at"]) < since:
            continue
        out[name] = payload
    return out


def _rows(payloads: Payloads, name: str) -> list[Mapping[str, Any]]:
    payload = payloads.get(name)
    return list(payload["rows"]) if payload else []


def _week(payloads: Payloads, backend: str, customers: int) -> Mapping[str, Any] | None:
    """The one-process, zero-latency end-to-end row of `backend` at `customers`, if measured."""
    for r in _rows(payloads, "e2e"):
        if (r["backend"], r["mailer"], r["executor"], r["customers"]) == (
            backend,
            "inproc",
            "inproc",
            customers,
        ):
            return r
    return None


def _unmeasured(target: str, why: str) -> Verdict:
    return Verdict(target, why, None)


def throughput(payloads: Payloads) -> Iterator[Verdict]:
    """100,000 customers in one process, zero-latency mailer: under 30 s on each backend."""
    for backend, target in (
        ("postgres", f"{WEEK:,} on PostgreSQL, zero-latency, in process, < {LIMIT_S:.0f} s"),
        ("sqlite", f"SQLite no slower: {WEEK:,} in the same {LIMIT_S:.0f} s"),
    ):
        row = _week(payloads, backend, WEEK)
        if row is None:
            yield _unmeasured(target, f"no {backend} {WEEK:,} row in this run")
            continue
        wall = row["wall_s"]
        yield Verdict(target, f"{wall:.2f} s ({WEEK / wall:,.0f} customers/s)", wall < LIMIT_S)


def floor_share(payloads: Payloads) -> Verdict:
    """The bulk-SQL floor's seconds over the PostgreSQL week's, both from this run."""
    target = f"at least {FLOOR_PCT:.0f} % of the bulk-SQL floor measured in the same run"
    floor = next((r for r in _rows(payloads, "floor") if r["customers"] == WEEK), None)
    week = _week(payloads, "postgres", WEEK)
    if floor is None or week is None:
        return _unmeasured(target, "the floor or the PostgreSQL week did not run")
    pct = 100 * floor["total_s"] / week["wall_s"]
    return Verdict(
        target, f"{pct:.1f} % ({floor['total_s']:.2f} / {week['wall_s']:.2f} s)", pct >= FLOOR_PCT
    )


def side_by_side(payloads: Payloads) -> Iterator[Verdict]:
    target = f"one step per customer vs. the default at {SIDE:,}, whole run: at least {RATIO:.0f}x"
    payload = payloads.get("side_by_side") or {}
    ratios = payload.get("ratios") or []
    customers = payload.get("options", {}).get("customers", SIDE)
    if not ratios:
        yield _unmeasured(target, "side by side did not run")
    elif customers != SIDE:
        yield _unmeasured(target, f"ran at {customers:,} customers")
        return
    for r in ratios:
        yield Verdict(
            f"{target} ({r['backend']})",
            f"{r['run_ratio']:.1f}x (deliveries {r['delivery_ratio']:.1f}x)",
            r["run_ratio"] >= RATIO,
        )


def _bound_pct(concurrency: int) -> float:
    return next(pct for top, pct in BOUND_PCT if top is None or concurrency <= top)


def latency_bound(payloads: Payloads) -> Iterator[Verdict]:
    """Each level judged on both the service's figure and the job's delivery phase."""
    rows = _rows(payloads, "latency")
    if not rows:
        yield _unmeasured("latency-bound share of concurrency / latency", "latency did not run")
    for r in rows:
        need = _bound_pct(r["concurrency"])
        service, job = r["pct_of_bound"], r["job_pct_of_bound"]
        yield Verdict(
            f"latency-bound at {r['concurrency']}: at least {need:.0f} % of the bound",
            f"{service:.1f} % (the job's phase {job:.1f} %)",
            min(service, job) >= need,
        )


def event_rows(payloads: Payloads) -> Iterator[Verdict]:
    """Every end-to-end row at 100,000 customers, whatever its executor or mailer."""
    rows = [r for r in _rows(payloads, "e2e") if r["customers"] == WEEK]
    target = f"at most {EVENT_ROWS} Dagster event-log rows per {WEEK:,} customers"
    if not rows:
        yield _unmeasured(target, f"no {WEEK:,} row in this run")
    for executor in sorted({r["executor"] for r in rows}):
        counts = [r["event_rows"] for r in rows if r["executor"] == executor]
        most = f"{max(counts)}" + (f" (the most of {len(counts)} rows)" if len(counts) > 1 else "")
        yield Verdict(f"{target} ({executor})", most, max(counts) <= EVENT_ROWS)


def large_week(payloads: Payloads) -> Iterator[Verdict]:
    rows = [r for r in _rows(payloads, "e2e") if r["customers"] >= LARGE]
    rss_target = f"{LARGE:,} customers: peak RSS < {RSS_MB:.0f} MB in every process"
    srv_target = f"{LARGE:,} customers: at most {SERVER_STATEMENTS} server statements a customer"
    if not rows:
        why = "not in this run (make bench BENCH_ARGS=--large)"
        yield _unmeasured(rss_target, why)
        yield _unmeasured(srv_target, why)
        return
    peak = max(max(r["rss_mb"], r["rss_children_mb"] or 0.0) for r in rows)
    yield Verdict(rss_target, f"{peak:.1f} MB (the most of {len(rows)} rows)", peak < RSS_MB)
    counted = [r["srv_stmts_per_cust"] for r in rows if r["srv_stmts_per_cust"] is not None]
    if not counted:
        yield _unmeasured(srv_target, "no PostgreSQL row")
    else:
        yield Verdict(srv_target, f"{max(counted):.2f}", max(counted) <= SERVER_STATEMENTS)


def _sent_twice(row: Mapping[str, Any]) -> int:
    # a row carries `tables.verdicts`' cell, or (Celery's) its two counts, or (the floor's, the
    # phases') no send that a mailer counted
    if "dup_sends" in row:
        return int(row["dup_sends"] or 0)
    return tables.sent_twice(row) if "mailer_dup_sends" in row else 0


def nothing_lost_or_doubled(payloads: Payloads) -> Verdict:
    """Every row of every benchmark in the run: its items accounted for, nothing sent or claimed
    twice (a row without an `accounted` cell, the floor's or Celery's, is judged on the rest)."""
    rows = [r for p in payloads.values() for r in p.get("rows", [])]
    target = "every benchmark row: items accounted for, nothing sent or claimed twice"
    if not rows:
        return _unmeasured(target, "no benchmark ran")
    lost = sum(r["accounted"] not in ("ok", True) for r in rows if "accounted" in r)
    sent = sum(_sent_twice(r) for r in rows)
    claimed = sum(int(r.get("ledger_double_claims") or 0) for r in rows)
    return Verdict(
        target,
        f"{len(rows)} rows: {lost} not accounted, {sent} sent twice, {claimed} claimed twice",
        lost == sent == claimed == 0,
    )


JUDGES: tuple[Callable[[Payloads], Verdict | Iterator[Verdict]], ...] = (
    throughput,
    floor_share,
    side_by_side,
    latency_bound,
    event_rows,
    large_week,
    nothing_lost_or_doubled,
)


def judge(payloads: Payloads) -> list[Verdict]:
    out: list[Verdict] = []
    for j in JUDGES:
        got = j(payloads)
        out.extend([got] if isinstance(got, Verdict) else got)
    return out


def report(json_dir: Path, since: datetime | None = None) -> list[Verdict]:
    """Prints the targets table for the JSON in `json_dir` (from `since` on) and writes it."""
    verdicts = judge(load(json_dir, since))
    rows = [v.row() for v in verdicts]
    tables.print_table("The scale targets, judged from this run's figures", rows, COLUMNS)
    tables.write_json(json_dir, "targets", {"rows": rows})
    return verdicts


def _instant(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 instant: {text!r}") from e
    if at.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset (add +00:00)")
    return at


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.targets", description=__doc__)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    p.add_argument(
        "--since",
        type=_instant,
        help="only JSON written at or after this instant (ISO 8601, with its offset)",
    )
    a = p.parse_args(argv)
    if not a.json_dir.is_dir():
        p.error(f"{a.json_dir} is not a folder (make bench writes its JSON to .digest/bench)")
    try:
        report(a.json_dir, a.since)
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
