"""The job's asset checks: one step per checked asset, eleven checks in four steps.

Each check is defined beside its kind (the ledger's invariants, the attempt check, the warnings);
this module only says which step evaluates it. A check's name, severity and blocking flag are
its own, so the UI, `digest status` and the ledger's report name it the same as before.
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

eligibility_snapshot_checks = check_step(
    "eligibility_snapshot", [snapshot_unchanged, no_invalid_recipients]
)
digest_content_checks = check_step("digest_content", [catalogue_products_valid])
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
digest_cleanup_checks = check_step("digest_cleanup", [at_most_one_cleanup_per_key])
