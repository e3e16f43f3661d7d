"""What the loopback provider does with one request of a key: the vocabulary of its scripts.

`ProviderServer.script(key, *actions)` queues these; a key with no script left gets the server's
fallback (`ok()` unless given).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    """What the server does with one request of a key; build one with the functions below."""

    kind: str
    status: int = 200
    name: str | None = None
    retry_after: str | None = None
    #: the response's `Date` header instead of the real time (to test HTTP-date Retry-After)
    date: str | None = None
    seconds: float = 0.0


def ok() -> Action:
    """Accept (the default once a key's script runs out): 200 `{"id": ...}`."""
    return Action("ok")


def status(
    code: int,
    name: str | None = None,
    retry_after: int | str | None = None,
    date: str | None = None,
) -> Action:
    """Answer `code` with a JSON error body and nothing stored."""
    return Action("status", code, name, None if retry_after is None else str(retry_after), date)


def quota() -> Action:
    """Answer 429 `daily_quota_exceeded`: the account's quota is spent."""
    return status(429, "daily_quota_exceeded")


def conflict_concurrent() -> Action:
    """Answer 409 `concurrent_idempotent_requests`, as for a key still in flight."""
    return status(409, "concurrent_idempotent_requests")


def store_then_hang(seconds: float = 5.0) -> Action:
    """Store the message as accepted, then answer only after `seconds` (or at shutdown)."""
    return Action("hang", seconds=seconds)


def store_then_drop() -> Action:
    """Store the message as accepted, then close the connection without a response."""
    return Action("drop")


def malformed_success() -> Action:
    """Store the message, then answer 200 with a body that has no `id`."""
    return Action("malformed")


def hold() -> Action:
    """Keep the key in flight until `release(key)` (or shutdown), then accept."""
    return Action("hold")
