"""The few HTML pages a person sees: the confirmation a GET shows, and the answers to a POST.

None of them names the customer or shows an address: the link itself is the only identity.
The confirmation's form has no `action`, so it posts to the very URL it was opened at (token
included), whatever host and path a reverse proxy gave it.
"""

from html import escape

from digest_pipeline.serve.forms import FIELD, VALUE

#: what every page answers with: not cached (the URL holds a token), never sent as a referrer,
#: never framed, and no script or remote content at all
HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
    ),
}


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem}"
        "button{font-size:1rem;padding:.5rem 1rem}</style></head>"
        f"<body><h1>{escape(title)}</h1>{body}</body></html>\n"
    )


def confirmation() -> str:
    """The GET page: one button that sends the RFC 8058 one-click POST."""
    return _page(
        "Unsubscribe from the weekly digest?",
        "<p>You will get no more weekly digests from us.</p>"
        '<form method="post">'
        f'<input type="hidden" name="{escape(FIELD)}" value="{escape(VALUE)}">'
        '<button type="submit">Unsubscribe</button></form>',
    )


def unsubscribed() -> str:
    """The answer to a valid POST, the first time and every time after."""
    return _page("You are unsubscribed", "<p>You will get no more weekly digests from us.</p>")


def refused(title: str) -> str:
    """A refusal: a link that is not valid, or a POST without the one-click body."""
    return _page(title, "<p>Nothing was changed.</p>")
