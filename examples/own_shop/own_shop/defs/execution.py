"""Steps run in the process that launched the run, as the digest's own project runs them.

One executor per code location, whatever the number of digest instances; `DIGEST_EXECUTOR`
chooses another (multiprocess, Celery, Kubernetes).
"""

from digest_pipeline.defs.execution import execution

__all__ = ["execution"]
