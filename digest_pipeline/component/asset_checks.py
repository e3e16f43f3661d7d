"""The job's asset checks, by the step that evaluates them: eleven checks in two kinds of step.

Each check is defined beside its kind (the ledger's invariants, the attempt check, the warnings);
this module only says which step evaluates it. The snapshot's, the content's and the cleanup's
checks run in their asset's own step (`component/assets.py`); the deliveries' in one step of their
own, after the delivery graph. A check's name, severity and blocking flag are its own, so the
UI, `digest status` and the ledger's report name it the same wherever it runs.
"""

import dagster as dg

from digest_pipeline.component.attempt_checks import every_due_item_attempted
from digest_pipeline.component.catalogue_checks import catalogue_products_valid
from digest_pipeline.component.check_step import check_step
from digest_pipeline.component.checks import (
    at_most_one_cleanup_per_key,
    every_customer_has_visible_state,
    no_duplicate_send,
    no_silent_timeout,
    snapshot_unchanged,
)
from digest_pipeline.component.snapshot_checks import no_invalid_recipients
from digest_pipeline.component.spec import DigestSpec
from digest_pipeline.component.warning_checks import complaint_rate, dead_letter_volume, stale_items

#: evaluated by `eligibility_snapshot`'s step
SNAPSHOT_CHECKS = (snapshot_unchanged, no_invalid_recipients)
#: evaluated by `digest_content`'s step
CONTENT_CHECKS = (catalogue_products_valid,)
#: evaluated by `digest_cleanup`'s step
CLEANUP_CHECKS = (at_most_one_cleanup_per_key,)

#: evaluated in one step of their own, after the delivery graph
DELIVERY_CHECKS = (
    no_silent_timeout,
    every_customer_has_visible_state,
    no_duplicate_send,
    every_due_item_attempted,
    stale_items,
    dead_letter_volume,
    complaint_rate,
)


def deliveries_checks(digest: DigestSpec) -> dg.AssetChecksDefinition:
    """The instance's one step evaluating `DELIVERY_CHECKS` on `digest_deliveries`."""
    return check_step(digest, "digest_deliveries", DELIVERY_CHECKS)
