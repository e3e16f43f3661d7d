"""Real process kills on PostgreSQL: worker processes SIGKILLed mid-delivery.

The harness and its worker live in `digest_pipeline.rigs.chaos`; `test_process_kills` is the
short version inside `make test`, and `make chaos` runs the long one (`benchmarks/chaos.py`).
"""
