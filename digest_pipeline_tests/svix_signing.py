"""Webhook headers signed by Svix's own library, as Resend sends them: never this project's signer."""

from datetime import datetime

from svix.webhooks import Webhook


def svix_headers(
    names: tuple[str, str, str], event_id: str, body: bytes, at: datetime, secret: str
) -> dict[str, str]:
    """The id, timestamp and signature headers, named `names`, signed by `svix` with `secret`."""
    id_name, stamp_name, signature_name = names
    # svix's wrapper is typed `str` and signs a str as its UTF-8 bytes: the same bytes
    return {
        id_name: event_id,
        stamp_name: str(int(at.timestamp())),
        signature_name: Webhook(secret).sign(event_id, at, body.decode()),
    }
