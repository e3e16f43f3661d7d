"""`DIGEST_EXECUTOR` and its Celery broker: where a run's steps execute (defs/execution.py).

Read when the definitions load, unlike the rest of `settings.py`, which a run reads at start.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from digest_pipeline.setting_values import InvalidSetting, read_value
from digest_pipeline.settings import one_of

#: where a run's steps execute (`DIGEST_EXECUTOR`; defs/execution.py)
EXECUTORS = ("in_process", "multiprocess", "celery", "k8s")


@dataclass(frozen=True)
class ExecutorSettings:
    """`DIGEST_EXECUTOR` and, for Celery, its broker: read when the definitions load."""

    name: str = "in_process"
    celery_broker_url: str | None = field(default=None, repr=False)
    celery_backend_url: str | None = field(default=None, repr=False)


def load_executor_settings(env: Mapping[str, str]) -> ExecutorSettings:
    """The executor every job of the code location uses; Celery needs its broker's URL."""
    name = read_value(env, "DIGEST_EXECUTOR", "in_process", one_of(EXECUTORS))
    if name != "celery":
        return ExecutorSettings(name)
    broker = env.get("DIGEST_CELERY_BROKER_URL", "").strip()
    if not broker:
        raise InvalidSetting(
            "DIGEST_EXECUTOR=celery needs DIGEST_CELERY_BROKER_URL "
            "(the broker the workers listen on, for example redis://127.0.0.1:6379/0)"
        )
    scheme = broker.partition("://")[0]
    # a Redis broker is its own result backend; Celery has no amqp:// result backend any more
    default_backend = broker if scheme in ("redis", "rediss") else "rpc://"
    backend = env.get("DIGEST_CELERY_BACKEND_URL", "").strip() or default_backend
    return ExecutorSettings(name, broker, backend)
