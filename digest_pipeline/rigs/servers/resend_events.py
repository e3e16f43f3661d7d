"""Resend's webhook requests as the loopback provider sends them: an event body, Svix's headers.

`webhook_payload` builds an `email.*` event about one message the way Resend shapes it, and
`signed_headers` signs a body as Svix does for Resend (`webhook-id`, `-timestamp`, `-signature`).
"""

from typing import Any

from digest_pipeline.domain.webhooks import parse_secret, signature


def webhook_payload(
    event_type: str,
    *,
    key: object | None = None,
    message_id: str | None = None,
    bounce_type: str | None = None,
) -> dict[str, Any]:
    """A Resend-style event body: `type`, and `data` with the message id and our key's tag.

    `event_type` is Resend's (`email.delivered`, `email.bounced`, `email.complained`, …);
    `bounce_type` (`Permanent`, `Transient`) goes in `data.bounce.type` as Resend puts it.
    """
    data: dict[str, Any] = {"created_at": "2026-10-19T06:00:00.000Z"}
    if message_id is not None:
        data["email_id"] = message_id
    if key is not None:
        # the tag the HTTP mailer set, spelled as Resend tags allow (`:` replaced)
        data["tags"] = {"operation_key": str(key).replace(":", "_")}
    if bounce_type is not None:
        data["bounce"] = {"type": bounce_type, "subType": "General", "message": "bounced"}
    return {"type": event_type, "created_at": data["created_at"], "data": data}


def signed_headers(secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Svix headers of one webhook request, signed with `secret` (`whsec_…` or plain)."""
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(parse_secret(secret), event_id, timestamp, body),
        "content-type": "application/json",
    }
