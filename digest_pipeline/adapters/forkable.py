"""What a forked delivery helper remakes in its own process: an adapter that has a recipe.

The ports declare no process concerns; an adapter that can be opened again elsewhere says how
(`recipe`). The runtime's helpers read it, and so does a composer for the clock it was given.
"""

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Forkable(Protocol):
    """A port a forked helper can make again in its own process: fresh connections, same target.

    `recipe` returns a zero-argument call that makes it, or None when it cannot (a test's
    object, a connection only this process can open). The object it makes must refuse to be a
    different one: a helper that cannot see the run's ledger fails instead of working on
    another database.
    """

    def recipe(self) -> Callable[[], Any] | None: ...


def recipe_of(port: object) -> Callable[[], Any] | None:
    """The port's recipe, or None for one that has none (`Forkable`)."""
    return port.recipe() if isinstance(port, Forkable) else None
