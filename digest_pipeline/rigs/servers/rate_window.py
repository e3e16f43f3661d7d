"""The loopback provider's rate limit: R requests in any sliding second, as Resend counts them.

Every arrival counts, refused ones too, as Resend counts every request: a client that keeps
knocking while throttled keeps the window full. Not thread-safe: the server calls it under its
own lock.
"""

import math
from collections import deque
from dataclasses import dataclass

#: Resend's rate limit is per second; the window slides with each arrival
RATE_WINDOW_SECONDS = 1.0


@dataclass(frozen=True)
class Admission:
    """The rate limit's verdict on one arrival, and the headers every answer to it carries."""

    refused: bool
    headers: tuple[tuple[str, str], ...]
    #: whole seconds until the window has room again (refusals only)
    retry_after: int | None


def _whole_seconds(seconds: float) -> int:
    # rounded up, as Retry-After must not send a client back early; the rounding to 1 µs first
    # keeps float noise (1.0000000002) from turning a 1 s wait into 2 s
    return max(1, math.ceil(round(seconds, 6)))


class SlidingWindow:
    """Admits `limit` arrivals in any sliding second; counts the ones it refused."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"rate_limit must be 1 or more requests a second, not {limit}")
        self.limit = limit
        self.refused = 0
        # the arrival times of the last `limit` requests: R arrivals within the past second
        # exist exactly when the R-th latest is inside it, so older ones never matter
        self._arrivals: deque[float] = deque(maxlen=limit)

    def admit(self, now: float) -> Admission:
        """Counts one arrival at `now` (seconds); refused when the past second holds `limit`."""
        window = self._arrivals
        while window and window[0] <= now - RATE_WINDOW_SECONDS:
            window.popleft()
        refused = len(window) >= self.limit
        window.append(now)  # full: the oldest drops out, and with it no arrival that matters
        self.refused += refused
        # the window has room again once its oldest arrival is a second old
        frees_in = _whole_seconds(window[0] + RATE_WINDOW_SECONDS - now)
        headers = (
            ("ratelimit-limit", str(self.limit)),
            ("ratelimit-remaining", str(max(0, self.limit - len(window)))),
            ("ratelimit-reset", str(frees_in)),
        )
        return Admission(refused, headers, frees_in if refused else None)
