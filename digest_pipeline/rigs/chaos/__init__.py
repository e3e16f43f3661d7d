"""Real process kills on PostgreSQL: worker processes SIGKILLed mid-delivery.

`harness` runs the experiment, `fleet` starts and kills the `worker` processes, `verdict` holds
its figures and checks, and `settings` its knobs; the tests' chaos tier runs the short version
inside `make test`, and `make chaos` the long one.
"""
