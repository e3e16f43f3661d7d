"""A plain-text digest from the generated rows, with the headers every digest must carry.

It is the composer until the Jinja2 templates (HTML + text) arrive; the headers it sets
(`Message-ID` from the operation key, `X-Digest-Operation-Key`) are the contract they keep.
"""

from collections.abc import Sequence

from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import DigestRow, Message, WorkItem, message_id_for
from digest_pipeline.ports import Composer


class PlainTextComposer(Composer):
    """One line per generated row: `title — price`, then a link."""

    def __init__(self, sender: str) -> None:
        self._sender = sender

    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        if "@" not in recipient or any(ch in recipient for ch in "\r\n"):
            raise RenderError(f"{item.key}: recipient is not a single address")
        lines = [f"Your picks for {item.period}:", ""]
        for row in rows:
            title = str(row.payload.get("title", "")).replace("\r", " ").replace("\n", " ")
            price = row.payload.get("price")
            url = row.payload.get("url")
            lines.append(f"- {title}" + (f" — {price}" if price is not None else ""))
            if url:
                lines.append(f"  {url}")
        return Message(
            key=item.key,
            recipient=recipient,
            sender=self._sender,
            subject=f"Your weekly picks ({item.period})",
            text="\n".join(lines) + "\n",
            headers=(
                ("Message-ID", message_id_for(item.key)),
                ("X-Digest-Operation-Key", str(item.key)),
            ),
        )
