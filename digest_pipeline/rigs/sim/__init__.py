"""`digest simulate`: the fault-injection and load harness.

It runs the real services (`Deliverer`, `deliver_due`, `reconcile_period`, `clean_period`, the
ledger's lease recovery) against the real SQL ledger and an in-process fault-injecting provider,
on virtual time, so a week of backoff takes seconds and one seed always gives the same numbers.
"""
