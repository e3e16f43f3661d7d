"""`python -m digest_pipeline.cli`."""

import sys

from digest_pipeline.cli import main

sys.exit(main())
