"""Real process kills on PostgreSQL (issue 6): worker processes SIGKILLed mid-delivery.

`harness` runs the experiment and checks it, `worker` is the process it starts and kills, and
`test_process_kills` is the short version inside `make test`; `make chaos` runs the long one.
"""
