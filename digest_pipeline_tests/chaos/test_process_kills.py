"""The short chaos run inside `make test`: real worker processes SIGKILLed on PostgreSQL.

Three workers deliver 300 customers through the real services to the real HTTP provider on
loopback while three rounds of SIGKILLs hit them; the provider's store and the ledger must then
show every customer delivered once, every item cleaned once and every invariant holding.
`make chaos` runs the long version (`benchmarks/chaos.py`).
"""

import pytest

from digest_pipeline.rigs.chaos.harness import run_chaos
from digest_pipeline.rigs.chaos.settings import SHORT
from digest_pipeline_tests.conftest import require_postgres_url


@pytest.mark.integration
def test_killed_workers_leave_every_customer_delivered_and_cleaned_exactly_once(tmp_path):
    report = run_chaos(require_postgres_url(), SHORT, tmp_path / "workers")

    print("\n".join(report.lines()))  # noqa: T201 - the figures, shown with -s or -rP
    assert report.passed
    assert report.kills >= SHORT.rounds
    assert report.provider_deliveries == report.items == SHORT.customers
    assert report.provider_duplicates == 0
    assert report.unknowns_left == 0
