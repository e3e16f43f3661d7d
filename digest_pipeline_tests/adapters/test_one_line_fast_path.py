"""A subject or preheader line skips the control-character substitution when it is printable: the
shortcut must give exactly the line the substitution gives, for every text."""

import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from digest_pipeline.adapters.mail import render


def substituted(text: str, limit: int | None = None) -> str:
    """The line as the substitution alone makes it (the composer's rule before the shortcut)."""
    line = render._CONTROL.sub(" ", text).strip()
    return line if limit is None or len(line) <= limit else line[: limit - 1].rstrip() + "…"


def test_no_printable_character_but_the_space_is_one_the_substitution_replaces():
    # the shortcut's premise, over every code point: a printable text holds nothing to replace
    # but runs of spaces, and `strip` removes exactly what `\s` matches
    space = re.compile(r"\s")
    for n in range(sys.maxunicode + 1):
        c = chr(n)
        assert not (c.isprintable() and c != " " and render._CONTROL.fullmatch(c)), hex(n)
        assert c.isspace() == bool(space.fullmatch(c)), hex(n)


# what lines are made of, and what should never reach one: line breaks, tabs, C0/C1 controls,
# Unicode spaces and separators, doubled spaces, an ellipsis-length cut
pieces = st.lists(
    st.sampled_from(
        [*"Ab é€", "  ", "\n", "\r\n", "\t", "\x00", "\x1f", "\x85", "\xa0", "\u2028", "\u200b"]
    ),
    max_size=24,
).map("".join)


@settings(max_examples=800)
@given(st.one_of(pieces, st.text(max_size=40)), st.one_of(st.none(), st.integers(1, 30)))
def test_the_shortcut_gives_the_line_the_substitution_gives(text, limit):
    assert render._one_line(text, limit) == substituted(text, limit)
