"""Real process kills on PostgreSQL: worker processes SIGKILLed mid-delivery.

`harness` runs the experiment and checks it, and `worker` is the process it starts and kills;
the tests' chaos tier runs the short version inside `make test`, and `make chaos` the long one.
"""
