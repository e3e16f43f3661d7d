"""A warning for operators on `digest_content`: catalogue products no digest can carry.

WARN severity, never blocking: a bad product is left out of every pick (the customers still get
their digests from the good ones), so the week goes on; the check tells the shop which rows to
fix. It re-screens the current catalogue through the source, not the run's in-memory plan, so
a re-run after the fix shows it passing.
"""

import dagster as dg

from digest_pipeline.component.check_step import CheckInputs, check
from digest_pipeline.component.report import SAMPLE, check_result
from digest_pipeline.domain.catalogue import screen_catalogue


@check("digest_content", "customer_source")
def catalogue_products_valid(inputs: CheckInputs) -> dg.AssetCheckResult:
    """Warns when catalogue products are left out of the picks because a digest cannot carry them.

    A product is left out when its link or image link is not a plain absolute http(s) URL (a
    quote, a space, a `javascript:` scheme), its title is empty or holds a line break, or its
    price, currency or creation time is not sane. The sample lists the product ids, and
    `excluded` each id with the failing fields (never their values). Fix the rows, then
    `digest regenerate` and `digest replay` for a week already delivered without them.
    """
    period = inputs.period
    good, bad = screen_catalogue(inputs.customer_source.products())
    named = ", ".join(f"{b.product_id} ({', '.join(b.fields)})" for b in bad[:SAMPLE])
    more = f" and {len(bad) - SAMPLE} more" if len(bad) > SAMPLE else ""
    return check_result(
        period,
        not bad,
        len(bad),
        [b.product_id for b in bad],
        f"{len(bad)} catalogue product(s) left out of the picks"
        + (f": {named}{more}" if bad else ""),
        dg.AssetCheckSeverity.WARN,
        products=len(good) + len(bad),
        excluded=dg.MetadataValue.json({b.product_id: list(b.fields) for b in bad[:100]}),
    )
