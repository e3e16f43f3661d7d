"""`make bench`: the scale benchmarks, the SQL floor and the phases one by one, consecutive
weeks on one ledger, the UI launch, `digest run` with one and two delivery processes, the
Celery scale-out, send pacing against a rate-limited provider and a shop source in its own
SQLite database against the demo tables, in order, each printing its
table and writing JSON; then the scale targets, judged from the JSON this invocation wrote
(`benchmarks.targets`).

Run under `scripts/pg-test-cluster.sh` (and `scripts/redis-test-server.sh` for Celery) for the
PostgreSQL variants; without `DIGEST_TEST_DATABASE_URL` (or `DIGEST_TEST_REDIS_URL`) they are
reported as skipped. `--sizes` sets the end-to-end customer counts, or, with `--only`, the one
size the chosen benchmark takes (floor/phases/side/weeks/scale/ui/run/celery/source: customers,
latency: the minimum items per level).
"""

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import (
    celery_scale,
    common,
    digest_run,
    e2e,
    floor,
    latency,
    pacing,
    phases,
    scale_out,
    shop_source,
    side_by_side,
    tables,
    targets,
    ui_launch,
    weeks,
)

ORDER = (
    "e2e",
    "floor",
    "phases",
    "side",
    "latency",
    "weeks",
    "scale",
    "ui",
    "run",
    "celery",
    "pacing",
    "source",
)


def _plans(a: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    only = a.only is not None
    first = a.sizes[0] if a.sizes else None
    sizes = list(a.sizes or e2e.SIZES) + ([e2e.LARGE] if a.large else [])
    return {
        "e2e": lambda: e2e.run(
            e2e.Options(
                sizes=sizes,
                executors=a.executors,
                max_run_seconds=a.max_run_seconds,
                json_dir=a.json_dir,
            )
        ),
        "floor": lambda: floor.run(
            floor.Options(
                customers=first if only and first else floor.CUSTOMERS, json_dir=a.json_dir
            )
        ),
        "phases": lambda: phases.run(
            phases.Options(
                customers=first if only and first else phases.CUSTOMERS, json_dir=a.json_dir
            )
        ),
        "side": lambda: side_by_side.run(
            side_by_side.Options(
                customers=first if only and first else side_by_side.CUSTOMERS,
                json_dir=a.json_dir,
            )
        ),
        "latency": lambda: latency.run(
            latency.Options(
                min_items=first if only and first else latency.MIN_ITEMS, json_dir=a.json_dir
            )
        ),
        "weeks": lambda: weeks.run(
            weeks.Options(
                customers=first if only and first else weeks.CUSTOMERS, json_dir=a.json_dir
            )
        ),
        "scale": lambda: scale_out.run(
            scale_out.Options(
                customers=first if only and first else scale_out.CUSTOMERS, json_dir=a.json_dir
            )
        ),
        "ui": lambda: ui_launch.run(
            ui_launch.Options(
                customers=first if only and first else ui_launch.CUSTOMERS, json_dir=a.json_dir
            )
        ),
        "run": lambda: digest_run.run(
            digest_run.Options(
                customers=first if only and first else digest_run.CUSTOMERS, json_dir=a.json_dir
            )
        ),
        "celery": lambda: celery_scale.run(
            celery_scale.Options(
                customers=first if only and first else celery_scale.CUSTOMERS,
                json_dir=a.json_dir,
            )
        ),
        "pacing": lambda: pacing.run(pacing.Options(json_dir=a.json_dir)),
        "source": lambda: shop_source.run(
            shop_source.Options(
                customers=first if only and first else shop_source.CUSTOMERS, json_dir=a.json_dir
            )
        ),
    }


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--only", choices=ORDER, help="run just this benchmark")
    p.add_argument("--large", action="store_true", help=f"add {e2e.LARGE:,} customers to e2e")
    p.add_argument(
        "--sizes",
        type=tables.int_list,
        help=f"e2e customer counts (default {','.join(map(str, e2e.SIZES))}); see above",
    )
    p.add_argument(
        "--executors",
        type=tables.str_list,
        default=list(e2e.EXECUTORS),
        help="e2e executors: inproc, multiprocess (2 step processes; postgres + inproc mailer)",
    )
    p.add_argument(
        "--max-run-seconds",
        type=float,
        default=e2e.Options.max_run_seconds,
        help="e2e: cut a larger size to what fits this at the previous size's rate",
    )
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    plans = _plans(a)
    since = datetime.now(UTC)
    started = time.perf_counter()
    for name in [a.only] if a.only else ORDER:
        t0 = time.perf_counter()
        plans[name]()
        print(f"[{name}: {time.perf_counter() - t0:,.0f} s]", flush=True)
    targets.report(a.json_dir, since)
    print(f"\nbenchmarks done in {time.perf_counter() - started:,.0f} s; JSON in {a.json_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
