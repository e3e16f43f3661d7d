"""The knobs of one chaos run (`SHORT` for `make test`, `LONG` for `make chaos`) and its API key.

Its own module because the harness, the worker fleet and the report all read the same settings,
and a module of their own lets each import them without importing the others.
"""

from dataclasses import dataclass

API_KEY = "re_test_chaos_harness"


@dataclass(frozen=True)
class ChaosSettings:
    """Every knob of one run; `SHORT` runs inside `make test`, `LONG` under `make chaos`."""

    customers: int = 300
    workers: int = 3
    rounds: int = 3
    seed: int = 20261019
    #: the visibility timeout: how long a killed worker's claims stay invisible
    lease_seconds: float = 2.0
    retry_base_seconds: float = 0.2
    retry_cap_seconds: float = 2.0
    #: generous: a key killed mid-send several times must not run out of attempts
    max_attempts: int = 25
    batch_size: int = 8
    concurrency: int = 4
    #: claims per worker pass; each pass also recovers leases, reconciles and cleans
    pass_items: int = 40
    #: upper bounds of the provider's random wait before it stores a message and before it
    #: answers, in milliseconds: sends take real time, so kills land mid-send
    provider_delay_before_ms: float = 8.0
    provider_delay_after_ms: float = 12.0
    #: kills happen when the period's progress passes a fraction drawn from this range
    kill_progress: tuple[float, float] = (0.05, 0.85)
    #: the random extra wait after a progress mark is reached, and before restarting victims
    kill_jitter_seconds: float = 0.3
    restart_pause_seconds: float = 0.5
    #: the whole run, seeding to verdict: a stuck item fails the run instead of hanging it
    timeout_seconds: float = 90.0


SHORT = ChaosSettings()
LONG = ChaosSettings(customers=5_000, workers=4, rounds=10, pass_items=100, timeout_seconds=900.0)
