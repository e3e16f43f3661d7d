"""Send pacing (`DIGEST_SEND_RATE`) against a provider that enforces R requests a second.

For each rate R and each count of concurrent `digest sweep` processes (senders of one install,
sharing the pace through the ledger), a fresh ledger holds one week of about 20·R customers (at
least 40: some 20 s of sending at R); sweeps repeat, in rounds of that many processes, until no
item is left to send. The loopback provider (rigs/servers/provider_server.py) counts every
`POST /emails` in a sliding second, as Resend does, and answers 429 `rate_limit_exceeded` with
Retry-After beyond R. Everything is measured as the provider saw it:

- `span_s`: first to last accepted request; `sent_per_s` = accepted / span_s (a perfect pacer
  shows a little over R on small cells: n sends need only about n/R - 1 seconds);
- `of_rate`: `sent_per_s` as % of R, target >= 90 %; `requests`: every POST the provider got;
  `throttled`: its 429 rate refusals as % of the requests, target <= 1 %;
- `rounds`: sweep rounds (each starts the processes anew); `dup_sends`: keys stored twice.

The floor rows run the same week (the largest cell's customers) on the same server without a
limit and without `DIGEST_SEND_RATE`, with the same process counts: what this machine can send,
which must be far above every R for the rows above to measure the pacing and not the machine.
On PostgreSQL (`DIGEST_TEST_DATABASE_URL`, as `make bench` sets) when it is there, else SQLite.
"""

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, tables
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.rigs.bootstrap import open_rig_ledger
from digest_pipeline.rigs.seeding import SHOP_LINK_SETTINGS, W42, seed_period
from digest_pipeline.rigs.servers.celery_rig import BIN, provider_settings
from digest_pipeline.rigs.servers.provider_server import ProviderServer

MODULE = "benchmarks.pacing"
RATES = (2, 10, 50)
PROCESSES = (1, 2)
QUICK_RATES = (2, 10)
QUICK_PROCESSES = (1,)
#: each cell sends for about this long at its rate
CELL_SECONDS = 20.0
MIN_CUSTOMERS = 40
#: a throttled item's retry comes due about a second after its Retry-After (jitter: this base)
RETRY_BASE_SECONDS = "1"
MAX_ROUNDS = 60
#: between rounds, so that items throttled in the last one come due
ROUND_PAUSE_S = 0.5
#: a cell is cut off (and says so) after this many times its nominal time, plus a minute
DEADLINE_FACTOR = 10.0
DELIVERED_TARGET_PCT = 90.0
THROTTLED_TARGET_PCT = 1.0
#: where an item ends without being sent; anything else but sent/cleaned still waits
UNSENT_STATES = ("failed", "dead_lettered", "suppressed")
COLUMNS = (
    "rate",
    "processes",
    "customers",
    "rounds",
    "wall_s",
    "span_s",
    "accepted",
    "sent_per_s",
    "of_rate",
    "requests",
    "rate_429",
    "throttled",
    "target_rate",
    "target_429",
    "left",
    "dup_sends",
    "note",
)


@dataclass(frozen=True)
class Options:
    rates: Sequence[int] = RATES
    processes: Sequence[int] = PROCESSES
    seconds: float = CELL_SECONDS
    #: `postgres` (the cluster behind DIGEST_TEST_DATABASE_URL) or `sqlite`
    backend: str = field(default_factory=lambda: "postgres" if common.pg_available() else "sqlite")
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


@dataclass
class Sweeps:
    """What the rounds of one cell did: how many, what is left, and the lines worth keeping."""

    rounds: int = 0
    left: int = 0
    unsent: int = 0
    #: distinct `stopped:` / pause lines the sweeps ended with, and how often each came
    lines: Counter[str] = field(default_factory=Counter)


def customers_for(rate: int, seconds: float) -> int:
    """About `seconds` of sending at `rate`, and never fewer than `MIN_CUSTOMERS`."""
    return max(MIN_CUSTOMERS, round(rate * seconds))


def _environment(server: ProviderServer, ledger_url: str, rate: int | None) -> dict[str, str]:
    """A sweep's whole environment: as an operator's shell would set it, nothing inherited."""
    extra = {
        "DIGEST_RETRY_BASE_SECONDS": RETRY_BASE_SECONDS,
        **SHOP_LINK_SETTINGS,
        **({"DIGEST_SEND_RATE": str(rate)} if rate is not None else {}),
    }
    settings = provider_settings(ledger_url, None, server, **extra)
    # the caller's DIGEST_* dropped, the benchmarks' private unsubscribe secret added
    digest = {k: v for k, v in common.hermetic(settings).items() if v is not None}
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {"PATH": path, "LANG": "C.UTF-8", **digest}


def _left(ledger: SqlLedger) -> tuple[int, int]:
    """(items still to send, items that ended unsent) of the seeded week."""
    counts = {s.value: n for s, n in ledger.state_counts(W42).items()}
    unsent = sum(counts.get(s, 0) for s in UNSENT_STATES)
    done = sum(counts.get(s, 0) for s in common.DONE_STATES)
    return sum(counts.values()) - done - unsent, unsent


def _round(env: dict[str, str], work: Path, n: int, processes: int, deadline: float) -> list[str]:
    """Runs `processes` sweeps at once and waits for them; returns their exit-1 lines.

    Exit 1 is a sweep that a breaker or a pause stopped, or a refused period (raised: the
    benchmark's week must be deliverable); anything above 1 is a crash, raised with its log.
    """
    logs = [work / f"sweep-{n:03d}-{p}.log" for p in range(processes)]
    started = []
    for log in logs:
        with log.open("w", encoding="utf-8") as out:
            started.append(
                subprocess.Popen(
                    [str(BIN / "digest"), "sweep", "--json"],
                    cwd=work,
                    env={**env, "HOME": str(work)},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=out,
                )
            )
    lines: list[str] = []
    for proc, log in zip(started, logs, strict=True):
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        text = log.read_text(encoding="utf-8", errors="replace")
        if code is None:
            lines.append("killed at the cell's deadline")
        elif code not in (0, 1) or (code == 1 and "refused:" in text):
            raise RuntimeError(f"digest sweep exited {code}:\n{text[-3000:]}")
        elif code == 1:
            lines += [line for line in text.splitlines() if line.strip()][-1:]
    return lines


def _sweep_until_sent(
    env: dict[str, str], ledger: SqlLedger, work: Path, processes: int, deadline: float
) -> Sweeps:
    done = Sweeps()
    for n in range(1, MAX_ROUNDS + 1):
        done.lines.update(_round(env, work, n, processes, deadline))
        done.rounds = n
        done.left, done.unsent = _left(ledger)
        if done.left == 0 or time.monotonic() >= deadline:
            break
        time.sleep(ROUND_PAUSE_S)
    return done


def _note(sweeps: Sweeps) -> str | None:
    """The lines sweeps stopped with (each once, with its count), trimmed for the table."""
    notes = [f"{count}x {line[:90]}" for line, count in sweeps.lines.most_common(2)]
    if sweeps.left:
        notes.insert(0, f"cut off with {sweeps.left} left")
    return "; ".join(notes) or None


def _verdict(value: float | None, target: float, higher_is_better: bool) -> str | None:
    if value is None:
        return None
    met = value >= target if higher_is_better else value <= target
    return "met" if met else "not met"


def measure(opts: Options, rate: int | None, processes: int, customers: int) -> dict[str, Any]:
    """One cell: a fresh ledger of `customers`, swept by `processes` at `rate` (None: floor)."""
    nominal = customers / rate if rate else opts.seconds
    with (
        common.workdir("pacing") as work,
        common.backend(opts.backend, work) as b,
        open_rig_ledger(b.ledger_url) as ledger,
    ):
        seed_period(ledger, customers)
        with ProviderServer(rate_limit=rate) as server:
            env = _environment(server, b.ledger_url, rate)
            deadline = time.monotonic() + DEADLINE_FACTOR * nominal + 60.0
            with common.Timer() as timer:
                sweeps = _sweep_until_sent(env, ledger, work, processes, deadline)
            stats = server.stats()
            stored = server.stored
            if server.handler_errors:
                raise RuntimeError(f"the provider's handlers failed {server.handler_errors} times")
    span = max(stats.accepted_at) - min(stats.accepted_at) if stats.accepted > 1 else None
    sent_per_s = stats.accepted / span if span else None
    of_rate = 100.0 * sent_per_s / rate if sent_per_s is not None and rate else None
    throttled = 100.0 * stats.rate_limited / stats.requests if stats.requests else None
    label = "floor" if rate is None else f"R={rate}"
    common.progress(
        f"{MODULE} {label}, {processes} process(es), {customers:,} customers: "
        f"{timer.seconds:,.1f} s, {stats.accepted:,} accepted of {stats.requests:,} requests"
    )
    return {
        "rate": rate if rate is not None else "floor",
        "processes": processes,
        "customers": customers,
        "backend": opts.backend,
        "rounds": sweeps.rounds,
        "wall_s": round(timer.seconds, 2),
        "span_s": round(span, 2) if span is not None else None,
        "accepted": stats.accepted,
        "sent_per_s": round(sent_per_s, 2) if sent_per_s is not None else None,
        "of_rate": f"{of_rate:.1f} %" if of_rate is not None else None,
        "of_rate_pct": of_rate,
        "requests": stats.requests,
        "rate_429": stats.rate_limited,
        "quota_429": stats.quota_refused,
        "throttled": f"{throttled:.1f} %" if throttled is not None else None,
        "throttled_pct": throttled,
        "target_rate": _verdict(of_rate, DELIVERED_TARGET_PCT, True) if rate else None,
        "target_429": _verdict(throttled, THROTTLED_TARGET_PCT, False) if rate else None,
        "left": sweeps.left,
        "unsent": sweeps.unsent,
        "dup_sends": sum(1 for bodies in stored.values() if len(bodies) > 1),
        "note": _note(sweeps),
    }


def run(opts: Options) -> dict[str, Any]:
    cells = [(r, p) for r in opts.rates for p in opts.processes]
    rows = [measure(opts, r, p, customers_for(r, opts.seconds)) for r, p in cells]
    floor_customers = max(customers_for(r, opts.seconds) for r in opts.rates)
    floor = [measure(opts, None, p, floor_customers) for p in opts.processes]
    tables.print_table(
        f"Send pacing: DIGEST_SEND_RATE=R against a provider refusing over R requests in any "
        f"sliding second (every request counts, as at Resend), {opts.backend} ledger, "
        f"`digest sweep` rounds in 1 or 2 processes until every item is sent; as the provider "
        f"saw it: sent_per_s = accepted / first-to-last accepted span; targets: of_rate >= "
        f"{DELIVERED_TARGET_PCT:g} % of R, throttled (429 rate refusals / requests) <= "
        f"{THROTTLED_TARGET_PCT:g} %",
        rows,
        COLUMNS,
    )
    tables.print_table(
        f"Floor, same run: the same server without a limit and without DIGEST_SEND_RATE, "
        f"{floor_customers:,} customers, same process counts (what the machine can send)",
        floor,
        COLUMNS,
    )
    return tables.publish("pacing", rows, opts, floor=floor)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"R={','.join(map(str, QUICK_RATES))}, one process (for development)",
    )
    p.add_argument("--rates", type=tables.int_list, help=f"default {RATES}")
    p.add_argument("--processes", type=tables.int_list, help=f"default {PROCESSES}")
    p.add_argument("--seconds", type=float, default=CELL_SECONDS, help="sending time per cell")
    p.add_argument("--backend", choices=("postgres", "sqlite"), help="default: postgres if set")
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    rates = a.rates or (QUICK_RATES if a.quick else RATES)
    processes = a.processes or (QUICK_PROCESSES if a.quick else PROCESSES)
    opts = Options(rates, processes, a.seconds, json_dir=a.json_dir)
    if a.backend is not None:
        opts = Options(rates, processes, a.seconds, a.backend, a.json_dir)
    if opts.backend == "postgres" and not common.pg_available():
        p.error(f"--backend postgres needs {common.PG_URL_ENV} (run under make bench)")
    run(opts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
