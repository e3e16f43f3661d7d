"""What the ledger's database reports about keeping commits through a crash, read on its connection.

PostgreSQL's `fsync` and `synchronous_commit` are read per session, so a value set for the role
or the database counts as well as the server's. A SQLite ledger reports nothing: its engine sets
`synchronous=FULL` on every connection (engine.py), so each commit is on disk when it returns.
"""

from sqlalchemy import Engine, text

#: one query reads both; `current_setting` returns what `SHOW` shows
_SETTINGS = text("SELECT current_setting('fsync'), current_setting('synchronous_commit')")


def read_durability(engine: Engine) -> dict[str, str]:
    """The ledger database's crash-safety settings by name (`{"fsync": "on", …}`); {} on SQLite."""
    if engine.dialect.name != "postgresql":
        return {}
    with engine.connect() as conn:
        fsync, synchronous_commit = conn.execute(_SETTINGS).one()
    return {"fsync": str(fsync), "synchronous_commit": str(synchronous_commit)}
