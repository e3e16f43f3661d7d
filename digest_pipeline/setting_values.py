"""How every settings module reads a variable: its parsed value or one line naming it.

`settings.py` and the modules it reads through (shop, source, executor) share these, so a bad
value is refused the same way wherever it is read.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from digest_pipeline.domain.errors import DigestError

T = TypeVar("T")
#: the SQLAlchemy drivers the ledger and a shop's source are tested on (SQLite's own module,
#: psycopg 3, psycopg2)
DATABASE_SCHEMES = (
    "sqlite",
    "sqlite+pysqlite",
    "postgresql",
    "postgresql+psycopg",
    "postgresql+psycopg2",
)


class InvalidSetting(DigestError, ValueError):
    """An environment variable holds a value the project cannot use."""


def read_value(
    env: Mapping[str, str], name: str, default: T, parse: Callable[[str], T], *, shown: bool = True
) -> T:
    """`name`'s parsed value, or `default` when unset; a refusal repeats the value if `shown`."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as e:
        raise InvalidSetting(f"{name}={raw!r}: {e}" if shown else f"{name}: {e}") from e


def read_small_file(
    path: Path, name: str, limit: int, kind: str, *, error: type[Exception] = InvalidSetting
) -> bytes:
    """The bytes of a file a setting names, at most `limit` of them; else `error`, one line.

    `name` is how the line names the setting, `kind` what the file should be (`a key`).
    """
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{name}: cannot be read ({e.strerror or type(e).__name__})") from e
    if len(data) > limit:
        raise error(f"{name}: larger than {limit // 1024} KiB, not {kind}")
    return data


def check_database_url(
    raw: str, name: str, example: str, *, error: type[DigestError] = InvalidSetting
) -> str:
    """`raw` if it names a supported scheme and, for SQLite, a file; else `error`, one line.

    The line never repeats the value: a PostgreSQL URL may hold a password.
    """
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError) as e:
        raise error(
            f"{name} is not a database URL; use sqlite:///PATH/{example} or "
            "postgresql://USER@HOST:PORT/DB"
        ) from e
    if url.drivername not in DATABASE_SCHEMES:
        raise error(
            f"{name}: the scheme {url.drivername}:// is not supported; use one of "
            f"{', '.join(f'{s}://' for s in DATABASE_SCHEMES)}"
        )
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise error(
            f"{name} names no SQLite file (an in-memory database would vanish with the "
            f"command); use sqlite:///PATH/{example}"
        )
    return raw
