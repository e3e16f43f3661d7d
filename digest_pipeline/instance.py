"""Prepares DAGSTER_HOME: the project's `dagster.yaml` plus the storage the environment asks for.

Dagster reads exactly one `dagster.yaml` from DAGSTER_HOME and fails on an unset `{env: …}`, so
the storage block is chosen here: SQLite inside DAGSTER_HOME by default, PostgreSQL through
dagster-postgres when `DAGSTER_PG_URL` or `DAGSTER_PG_HOST` is set (its run storage's and
event log's connections pooled: `digest_pipeline.dagster_storage`).

Dagster creates its SQLite schema on the first `DagsterInstance` of a home, and two processes
doing that at once collide (`table alembic_version already exists`). So the file is written and
the instance created and migrated once, under an exclusive lock on `<home>/.digest-instance.lock`:
a concurrent first `digest run` waits for the lock and then finds the home ready.
"""

import fcntl
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import yaml

from digest_pipeline.settings import InvalidSetting

DEFAULT_HOME = Path(".digest") / "dagster_home"
#: held (flock, exclusive) while the home's file is written and its storage created
LOCK_FILE = ".digest-instance.lock"
PG_SCHEME = "postgresql+psycopg2"
#: named as text: importing it here would load Dagster for every storage-block check
STORAGE_MODULE = "digest_pipeline.dagster_storage"
PG_FIELDS = {
    "DAGSTER_PG_USERNAME": "username",
    "DAGSTER_PG_PASSWORD": "password",
    "DAGSTER_PG_HOST": "hostname",
    "DAGSTER_PG_DB": "db_name",
    "DAGSTER_PG_PORT": "port",
}


def storage_block(env: Mapping[str, str]) -> dict[str, object] | None:
    """The `storage:` section for the environment, or None for Dagster's SQLite default.

    dagster-postgres 0.29 writes `NOTIFY run_events, :id` with a bound parameter, which only
    psycopg2's client-side binding accepts; SQLAlchemy 2.1 maps a plain `postgresql://` to
    psycopg 3, and then every event write fails. So the driver must be psycopg2, named in the
    URL or set as the `scheme` of the field form. The block names dagster-postgres's storage
    with pooled connections (`dagster_storage.PooledPostgresStorage`), configured as
    `storage: postgres:` would be.
    """
    url = env.get("DAGSTER_PG_URL")
    if url:
        if not url.startswith(f"{PG_SCHEME}://"):
            raise InvalidSetting(
                f"DAGSTER_PG_URL must name the psycopg2 driver ({PG_SCHEME}://user@host/db): "
                "dagster-postgres cannot write events through psycopg 3"
            )
        return _pooled({"postgres_url": {"env": "DAGSTER_PG_URL"}})
    if env.get("DAGSTER_PG_HOST"):
        fields: dict[str, object] = {
            field: {"env": name} for name, field in PG_FIELDS.items() if env.get(name)
        }
        fields.setdefault("db_name", "dagster")
        fields.setdefault("username", "postgres")
        fields["scheme"] = PG_SCHEME
        return _pooled({"postgres_db": fields})
    return None


def _pooled(config: dict[str, object]) -> dict[str, object]:
    return {
        "custom": {"module": STORAGE_MODULE, "class": "PooledPostgresStorage", "config": config}
    }


@contextmanager
def home_lock(home: Path) -> Iterator[None]:
    """An exclusive lock on the home, held until the block ends; waits for another holder.

    `flock` is released by the kernel when its holder dies, so a killed run never leaves the
    home locked; the lock file itself stays (empty) and is reused.
    """
    with (home / LOCK_FILE).open("a", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _write_if_changed(path: Path, text: str) -> None:
    """Replaces `path` atomically, and only when its text differs.

    Another process may be reading the file (creating its instance) right after the lock is
    released; it sees the old file or the new one, never a half-written one.
    """
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def initialise_instance(home: Path) -> None:
    """Creates (or migrates) the home's Dagster storage once, then lets it go."""
    # Imported here: loading Dagster takes seconds the storage-block checks should not pay.
    import dagster as dg

    dg.DagsterInstance.from_config(str(home)).dispose()


def prepare_home(project_root: Path, env: Mapping[str, str], home: Path | None = None) -> Path:
    """Writes `<home>/dagster.yaml` and creates the instance's storage; returns the home folder.

    Both happen under the home's lock (module docstring), so the caller's own `DagsterInstance`
    finds the storage ready even when another first run prepares the same home at once.
    """
    storage = storage_block(env)  # refuse a bad storage setting before touching the disk
    chosen = home if home is not None else env.get("DAGSTER_HOME") or project_root / DEFAULT_HOME
    home = Path(chosen).resolve()
    config = yaml.safe_load((project_root / "dagster.yaml").read_text(encoding="utf-8")) or {}
    if storage is not None:
        config["storage"] = storage
    text = "# generated from the project's dagster.yaml by digest_pipeline.instance\n"
    text += yaml.safe_dump(config, sort_keys=False)
    home.mkdir(parents=True, exist_ok=True)
    with home_lock(home):
        _write_if_changed(home / "dagster.yaml", text)
        if storage is None:
            # The race is on the SQLite files inside the home (two first runs creating one
            # schema). PostgreSQL storage is shared by every home and reads its URL from the
            # process environment, which `env` need not be: it is left to the first instance.
            initialise_instance(home)
    return home


def main() -> int:
    """`python -m digest_pipeline.instance`: prepare the home and print its path."""
    try:
        home = prepare_home(Path.cwd(), os.environ)
    except InvalidSetting as e:
        sys.stderr.write(f"digest_pipeline.instance: error: {e}\n")
        return 2
    sys.stdout.write(f"{home}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
