"""A warning on `eligibility_snapshot`: eligible customers the snapshot had to leave out.

An active, opted-in customer whose id cannot form an operation key, or whose address is longer
than 320 characters, is never sent a digest. The snapshot counts them in its metadata
(`invalid_ids`), but metadata is gone with the run; this check recounts them from the customer
source, which is durable, so it reads the same when it is re-executed later. WARN: the rest of
the week is unaffected, but someone should fix the source rows.
"""

import dagster as dg

from digest_pipeline.component.check_step import CheckInputs, check
from digest_pipeline.component.report import check_result
from digest_pipeline.domain.model import MAX_ADDRESS_LENGTH
from digest_pipeline.services.snapshot import count_exclusions


@check("eligibility_snapshot", "customer_source")
def no_invalid_recipients(inputs: CheckInputs) -> dg.AssetCheckResult:
    """Warns when eligible customers are left out for an invalid id or an over-long address.

    Metadata: `invalid_ids` and `long_addresses` (counts of active, opted-in customers in the
    source as it is now) and `sample`, up to ten ids of customers with an over-long address.
    Invalid ids are only counted, never shown: such an id may hold anything. Addresses are never
    shown.
    """
    period = inputs.period
    found = count_exclusions(inputs.customer_source)
    return check_result(
        period,
        found.total == 0,
        found.total,
        found.long_address_ids,
        f"{found.invalid_ids} eligible customer(s) with an invalid id and {found.long_addresses} "
        f"with an address over {MAX_ADDRESS_LENGTH} characters are left out",
        dg.AssetCheckSeverity.WARN,
        invalid_ids=found.invalid_ids,
        long_addresses=found.long_addresses,
    )
