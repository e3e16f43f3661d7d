"""Per-message CPU cost of rendering a digest and of turning it into wire bytes.

`Jinja2Composer.compose` runs once per customer and `to_bytes` once per message on its way out
(outbox, SMTP), so at 100,000 customers a week each microsecond here is 0.1 s of one process.
Run with `.venv/bin/python -m benchmarks.compose [--messages N] [--picks N] [--repeats N]`;
each figure is the best of the repeats, to keep scheduler noise out.
"""

import argparse
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.domain.model import DigestRow, WorkItem
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Clock

NOW = datetime(2026, 10, 12, 6, 0, tzinfo=UTC)
PERIOD = Period(2026, 42)


class _Fixed(Clock):
    def now(self) -> datetime:
        return NOW


def _work(n: int, picks: int) -> tuple[WorkItem, str, list[DigestRow]]:
    key = OperationKey(PERIOD, f"customer-{n:06d}")
    item = WorkItem(key=key, state=DeliveryState.CLAIMED, created_at=NOW, next_attempt_at=None)
    rows = [
        DigestRow(
            key,
            p,
            {
                "title": f"Walnut chopping board, oiled, {p + 1} of {picks}",
                "price": f"{19 + p}.90",
                "currency": "EUR",
                "url": f"https://shop.example/p/prod-{n % 500 + p:04d}",
                "image_url": f"https://cdn.shop.example/p/prod-{n % 500 + p:04d}.jpg",
                "customer_name": "Ada Lovelace",
            },
        )
        for p in range(picks)
    ]
    return item, f"ada.lovelace.{n:06d}@example.com", rows


def _best_us(run: Callable[[], object], count: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best / count * 1e6


def bench_composer() -> Jinja2Composer:
    """The project's composer with a fixed clock and the settings' shape of sender and link."""
    return Jinja2Composer(
        sender="Example Shop <digest@example.com>",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="benchmark-secret",
        clock=_Fixed(),
    )


def compose_us(messages: int = 2000, picks: int = 6, repeats: int = 3) -> float:
    """Microseconds a digest takes to compose on this machine, now (best of `repeats`).

    The per-item Python floor of a sitting: the SQL floor says how fast the database is, this
    says how fast the worker's own Python is, so sittings on a faster or slower machine compare.
    """
    composer = bench_composer()
    work = [_work(n, picks) for n in range(messages)]
    for w in work:
        composer.compose(*w)  # warms Jinja2's and the pick blocks' caches
    return _best_us(lambda: [composer.compose(*w) for w in work], len(work), repeats)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--picks", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    composer = bench_composer()
    work = [_work(n, args.picks) for n in range(args.messages)]
    messages = [composer.compose(*w) for w in work]  # also warms Jinja2 and the email package
    templates = composer.templates
    item, _, first_rows = work[0]
    context = composer.template_context(item, first_rows) | {"preheader": ""}
    rows = [
        ("compose (whole)", compose_us(args.messages, args.picks, args.repeats)),
        (
            "  of which the 4 templates",
            _best_us(
                lambda: [t.render(context) for _ in work for t in templates.values()],
                len(work),
                args.repeats,
            ),
        ),
        (
            "to_bytes",
            _best_us(lambda: [to_bytes(m) for m in messages], len(messages), args.repeats),
        ),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{args.messages} messages, {args.picks} picks each, best of {args.repeats}")
    print(f"{'step':<{width}}  µs/message")
    for name, micros in rows:
        print(f"{name:<{width}}  {micros:10.1f}")


if __name__ == "__main__":
    main()
