"""Whether a ledger database keeps a commit through a crash, decided from the settings it reports.

A commit the database can lose in a crash takes an "attempt started" row with it, and the next
process sends that digest again (design §8). PostgreSQL with `fsync` or `synchronous_commit`
off is such a database: delivery is refused there unless `DIGEST_ALLOW_NONDURABLE_LEDGER` says
the ledger is a throwaway.
"""

from collections.abc import Mapping

#: the environment setting that lets a delivery go ahead on a ledger that can lose commits
ALLOW_VARIABLE = "DIGEST_ALLOW_NONDURABLE_LEDGER"
#: each reported setting's values that let a crash undo a commit the client was told of.
#: `synchronous_commit`'s `local`, `remote_write` and `remote_apply` all flush the primary's
#: WAL before the commit returns; only `off` does not (PostgreSQL docs, "synchronous_commit").
UNSAFE_VALUES: Mapping[str, frozenset[str]] = {
    "fsync": frozenset({"off"}),
    "synchronous_commit": frozenset({"off"}),
}


def unsafe_settings(reported: Mapping[str, str]) -> list[str]:
    """`name=value` for each reported setting that can lose a commit, in `UNSAFE_VALUES` order."""
    found = {name: value.strip().lower() for name, value in reported.items()}
    return [
        f"{name}={found[name]}"
        for name, unsafe in UNSAFE_VALUES.items()
        if name in found and found[name] in unsafe
    ]


def durability_refusal(reported: Mapping[str, str], *, allowed: bool, what: str) -> str | None:
    """Why `what` must not go on with a ledger reporting `reported`, or None when it may.

    Args:
        reported: the database's settings by name, as it reports them (`SHOW fsync` → `on`);
            empty for a database whose commits the ledger makes durable itself (SQLite).
        allowed: whether `DIGEST_ALLOW_NONDURABLE_LEDGER` declares the ledger a throwaway.
        what: the refused action as the line names it (`digest sweep`, `delivery`).
    """
    unsafe = unsafe_settings(reported)
    if not unsafe or allowed:
        return None
    return (
        f"{what} refused: the ledger's PostgreSQL runs with {' and '.join(unsafe)}, so a crash "
        "can lose recorded attempts and send digests twice; turn the setting on, or set "
        f"{ALLOW_VARIABLE}=1 if this ledger is a throwaway"
    )
