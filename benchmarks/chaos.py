"""`make chaos`: the long process-kill run (digest_pipeline/rigs/chaos/harness.py) and its figures.

Run it under `scripts/pg-test-cluster.sh -- .venv/bin/python -m benchmarks.chaos [options]`;
the options (`--customers`, `--workers`, `--rounds`, `--seed`, ...) override the long defaults.
Exits non-zero when any check fails.
"""

import sys

from digest_pipeline.rigs.chaos.harness import main
from digest_pipeline.rigs.chaos.settings import LONG

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], base=LONG))
