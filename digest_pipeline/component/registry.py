"""The digest instances the loaded definitions built, by name, for the `digest` command.

`digest --instance NAME` loads the project's code location (as `digest run` does) and reads the
instance's settings here, so the command and the instance's Dagster runs read the same values.
"""

from digest_pipeline.component.spec import DigestSpec

_BUILT: dict[str, DigestSpec] = {}


def register(spec: DigestSpec) -> None:
    """Records an instance as its definitions are built (a later build of the name replaces it)."""
    _BUILT[spec.names.instance] = spec


def built(name: str) -> DigestSpec | None:
    """The instance named `name` the definitions built in this process, or None."""
    return _BUILT.get(name)


def names() -> list[str]:
    """Every instance built in this process, sorted."""
    return sorted(_BUILT)
