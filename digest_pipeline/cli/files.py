"""The one way the `digest` command reads a file: at most a bounded number of bytes.

A size from `stat` says nothing for `/dev/zero`, a FIFO or a file that grows while it is read, so
the bound is on the bytes read: at most the limit and one more, and that one more is a one-line
refusal (exit 2) naming the file and the limit, before anything is recorded.
"""

from pathlib import Path

from digest_pipeline.cli.context import UsageError

#: the most any file given to `digest` may hold: a keys file of 1 MiB names some 7,000 keys, and
#: the project's YAML files are a few hundred bytes
MAX_INPUT_BYTES = 1024 * 1024


def read_input(path: Path, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of `path`; anything larger than `limit` bytes is refused in one line.

    `what` names the file in the refusal (`--keys-file`, `dagster.yaml`). An unreadable file,
    one larger than `limit` and one that is not UTF-8 text are each a UsageError.
    """
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read it: {e.strerror or type(e).__name__}") from e
    if len(data) > limit:
        raise UsageError(
            f"{what} {path}: refused, it holds more than {limit} bytes (the limit for a file "
            "digest reads); nothing changed"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path}: cannot read it: not UTF-8 text") from e
