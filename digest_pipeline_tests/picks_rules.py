"""Picks rules the tests name through `DIGEST_PICKS_RULE`: the documented example and broken ones.

`cheapest_first` is the example of docs/how-to/replace-the-picks-rule.md, line for line.
"""

import functools
import itertools

from digest_pipeline.domain.catalogue import PickPlan, PickRequest, Product

#: customer ids the rules below single out
UNLUCKY = "customer-0002"


@functools.lru_cache(maxsize=1)
def _cheapest(week: PickPlan) -> list[str]:
    """The week's catalogue, cheapest first: worked out once a week, not once a customer."""
    ranked = sorted(week.catalogue.values(), key=lambda p: (p.price_cents, p.product_id))
    return [p.product_id for p in ranked]


def cheapest_first(request: PickRequest) -> list[str]:
    """The cheapest products of the week the customer has not bought."""
    owned = {order.product_id for order in request.bought}
    fresh = (pid for pid in _cheapest(request.week) if pid not in owned)
    return list(itertools.islice(fresh, request.limit))


def raises_for_one(request: PickRequest) -> list[str]:
    """The example rule, but one customer's picks raise (with their id in the message)."""
    if request.customer_id == UNLUCKY:
        raise LookupError(f"no profile for {request.customer_id}: Walnut chopping board")
    return cheapest_first(request)


def junk_for_one(request: PickRequest) -> list[str]:
    """The example rule, but one customer gets a product id the catalogue does not have."""
    if request.customer_id == UNLUCKY:
        return ["product-404", *cheapest_first(request)][: request.limit]
    return cheapest_first(request)


def too_many_for_one(request: PickRequest) -> list[Product]:
    """The whole catalogue for one customer: more than the limit."""
    if request.customer_id == UNLUCKY:
        return list(request.catalogue.values())
    return [request.catalogue[pid] for pid in cheapest_first(request)]


def a_set_for_one(request: PickRequest) -> object:
    """A set for one customer: not an order, so not picks."""
    picks = cheapest_first(request)
    return set(picks) if request.customer_id == UNLUCKY else picks


#: not callable
not_a_rule = 42


def two_arguments(request: PickRequest, limit: int) -> list[str]:
    """Callable, but not with the one argument a rule is given."""
    return []
