"""The job's asset checks, by the step that evaluates them: eleven checks in two kinds of step.

Each check is defined beside its kind (the ledger's invariants, the attempt check, the warnings);
this module only says which step evaluates it. The snapshot's, the content's and the cleanup's
checks run in their asset's own step (`defs/assets.py`); the deliveries' in one step of their
own, after the delivery graph. A check's name, severity and blocking flag are its own, so the
UI, `digest status` and the ledger's report name it the same wherever it runs.
"""

from digest_pipeline.defs.attempt_checks import every_due_item_attempted
from digest_pipeline.defs.catalogue_checks import catalogue_products_valid
from digest_pipeline.defs.check_step import check_step
from digest_pipeline.defs.checks import (
    at_most_one_cleanup_per_key,
    every_customer_has_visible_state,
    no_duplicate_send,
    no_silent_timeout,
    snapshot_unchanged,
)
from digest_pipeline.defs.snapshot_checks import no_invalid_recipients
from digest_pipeline.defs.warning_checks import complaint_rate, dead_letter_volume, stale_items

#: evaluated by `eligibility_snapshot`'s step
SNAPSHOT_CHECKS = (snapshot_unchanged, no_invalid_recipients)
#: evaluated by `digest_content`'s step
CONTENT_CHECKS = (catalogue_products_valid,)
#: evaluated by `digest_cleanup`'s step
CLEANUP_CHECKS = (at_most_one_cleanup_per_key,)

digest_deliveries_checks = check_step(
    "digest_deliveries",
    [
        no_silent_timeout,
        every_customer_has_visible_state,
        no_duplicate_send,
        every_due_item_attempted,
        stale_items,
        dead_letter_volume,
        complaint_rate,
    ],
)
