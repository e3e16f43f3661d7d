"""`digest serve`: the one-click unsubscribe and provider webhook application, under uvicorn.

It serves `digest_pipeline.serve.app` on `--host`/`--port` (default 127.0.0.1:8025, where the
default `DIGEST_UNSUBSCRIBE_URL` points) against the configured ledger, until SIGINT or SIGTERM.
It refuses to start, in one line, with the public demo secret or a short one, an unsubscribe
link that is not public https or no postal address on a ledger without demo data (cli/secrets.py),
with a secret that is not the one the ledger recorded, without the rotated-out secret
(`DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS`) while a rotation's overlap is open, on a ledger whose
database can lose commits (cli/durability.py), and with a port it cannot listen on.
"""

import argparse
from typing import Any

from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore, concurrent_callers
from digest_pipeline.cli.context import EXIT_FAILED, EXIT_OK, Context, UsageError, ascii_int
from digest_pipeline.cli.durability import require_durable_ledger
from digest_pipeline.cli.secrets import compliance_of
from digest_pipeline.domain.webhooks import InvalidWebhookSecret
from digest_pipeline.serve.app import ServeConfig, build_app
from digest_pipeline.serve.server import listening_socket, serve_forever
from digest_pipeline.services.link_secrets import serve_secrets
from digest_pipeline.settings import DEFAULT_SERVE_HOST, DEFAULT_SERVE_PORT


def register(sub: Any) -> None:
    """Adds `digest serve`."""
    p = sub.add_parser(
        "serve",
        help="serve one-click unsubscribe and provider webhooks over HTTP",
        description="POST /unsubscribe/{customer_id}?token=… (RFC 8058 one-click; a GET shows "
        "a confirmation page) and POST /events/{provider} (signed webhooks, DIGEST_WEBHOOK_"
        "SECRETS). Runs until interrupted; put it behind a TLS-terminating reverse proxy.",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_SERVE_HOST,
        help=f"address to listen on (default {DEFAULT_SERVE_HOST}: loopback, for a proxy)",
    )
    p.add_argument(
        "--port",
        type=ascii_int,
        default=DEFAULT_SERVE_PORT,
        help=f"port to listen on (default {DEFAULT_SERVE_PORT}; 0 picks a free one)",
    )
    p.set_defaults(handler=run_serve)


def run_serve(ctx: Context, args: argparse.Namespace) -> int:
    """Checks the settings and the secret, binds the port, then serves until interrupted."""
    if not 0 <= args.port <= 65_535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    settings = ctx.settings
    # webhooks and unsubscribes are ledger writes a crash must not undo (cli/durability.py)
    require_durable_ledger(ctx, "digest serve")
    secrets = serve_secrets(
        ctx.ledger,
        settings.unsubscribe_secret,
        settings.unsubscribe_secret_previous,
        ctx.clock.now(),
        compliance=compliance_of(ctx),
    )
    engine = ctx.engine
    try:
        app = build_app(
            config=ServeConfig(
                unsubscribe_secret=secrets.current,
                previous_unsubscribe_secret=secrets.previous,
                previous_secret_until=secrets.previous_until,
                webhook_keys=settings.webhook_keys(),
                webhook_tolerance=settings.webhook_tolerance,
                ledger_threads=concurrent_callers(engine),
                sns=settings.sns,
            ),
            store=SqlFeedbackStore(engine, ctx.ledger.instance),
            ledger=ctx.ledger,
            queue=ctx.ledger,
            clock=ctx.clock,
        )
    except InvalidWebhookSecret as e:
        # a SendGrid verification key is parsed when the application is built
        raise UsageError(f"DIGEST_WEBHOOK_SECRETS: {e}") from e
    try:
        sock = listening_socket(args.host, args.port)
    except OSError as e:
        ctx.err.write(f"digest serve: error: cannot listen on {args.host}:{args.port}: {e}\n")
        return EXIT_FAILED
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    webhooks = {*settings.webhook_keys(), *(["ses"] if settings.sns else [])}
    providers = ", ".join(sorted(webhooks)) or "none configured"
    ctx.err.write(f"digest serve: listening on http://{shown}:{port} (webhooks: {providers})\n")
    ctx.err.flush()
    try:
        serve_forever(app, sock, settings.serve_limits)
    except KeyboardInterrupt:
        pass  # uvicorn has shut down and re-raised the SIGINT that stopped it
    finally:
        sock.close()
    ctx.err.write("digest serve: stopped\n")
    return EXIT_OK
