"""Who may act as an operator, and how long a name and a reason may be.

One rule for the CLI's `--operator` and `--reason` and for the UI's late-grant run tags.
`DIGEST_OPERATORS` entries are `NAME` (OS user NAME acts as NAME) or `NAME=OS_USER`.
"""

from digest_pipeline.settings import InvalidSetting

#: an operator's name is short enough that `name (os:user)` fits the audit's 128-character actor
MAX_OPERATOR = 64
#: the audit log's `actor` column
MAX_ACTOR = 128
MAX_REASON = 2000


def operator_grants(allowed: frozenset[str]) -> dict[str, frozenset[str]]:
    """`DIGEST_OPERATORS` entries as operator -> the OS users who may act as them.

    `alice` lets OS user alice act as alice; `alice=ops` lets OS user ops act as alice too.
    """
    grants: dict[str, set[str]] = {}
    for entry in allowed:
        name, sep, user = (part.strip() for part in entry.partition("="))
        if not name or (sep and not user):
            raise InvalidSetting(f"DIGEST_OPERATORS entry {entry!r}: use NAME or NAME=OS_USER")
        grants.setdefault(name, set()).add(user if sep else name)
    return {name: frozenset(users) for name, users in grants.items()}
