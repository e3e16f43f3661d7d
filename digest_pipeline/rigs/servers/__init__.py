"""Real servers on 127.0.0.1 for tests and benchmarks: an HTTP provider, Dagster's UI, Celery.

Each one starts what it runs and always stops it; none of them needs pytest.
"""
