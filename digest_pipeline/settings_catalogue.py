"""Every `DIGEST_*` variable the code reads, with its default, meaning and accepted values.

`settings.py` reads them imperatively; this catalogue is what the documentation shows (the hook in
`docs/hooks/reference.py` renders it), and a unit test holds it to the names the code reads.
"""

from typing import NamedTuple


class Setting(NamedTuple):
    """One environment variable: its name and, as documentation text, the rest."""

    name: str
    default: str
    meaning: str
    accepted: str


# One entry per variable, in the order an operator meets them; "—" means no constraint beyond
# the meaning. Numeric ranges are `settings.range_text(name)`, which a test checks.
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    Setting("DIGEST_DATABASE_URL", "`sqlite:///<project>/.digest/digest.db`",
            "ledger and source tables (`postgresql://user@host:port/db` for PostgreSQL)",
            "`sqlite:///PATH` (a file: `sqlite://` and `sqlite:///` would be in memory), `postgresql://`, `postgresql+psycopg://`, `postgresql+psycopg2://` (also `sqlite+pysqlite:///PATH`); anything else, MySQL included, is refused"),
    Setting("DIGEST_MAILER", "`outbox`",
            "`outbox`, `smtp` or `http`",
            "—"),
    Setting("DIGEST_OUTBOX_DIR", "`.digest/outbox`",
            "Maildir of the outbox mailer",
            "—"),
    Setting("DIGEST_SMTP_HOST", "— (required for `smtp`)",
            "SMTP relay",
            "—"),
    Setting("DIGEST_SMTP_PORT", "25/587/465 by security",
            "SMTP relay port",
            "1 to 65535"),
    Setting("DIGEST_SMTP_USERNAME", "—",
            "SMTP authentication user (authentication only when it is set)",
            "—"),
    Setting("DIGEST_SMTP_PASSWORD", "—",
            "SMTP authentication password (used only when a username is set)",
            "—"),
    Setting("DIGEST_SMTP_SECURITY", "`starttls`",
            "`none`, `starttls` or `tls`",
            "—"),
    Setting("DIGEST_SMTP_TIMEOUT_SECONDS", "30",
            "every SMTP socket wait",
            "0.1 to 3600"),
    Setting("DIGEST_DKIM_KEY_FILE", "— (unsigned)",
            "PEM private key the SMTP mailer signs with (RSA of 1024 bits or more, or Ed25519; unencrypted; at most 64 KiB); set all three `DIGEST_DKIM_*` or none",
            "—"),
    Setting("DIGEST_DKIM_SELECTOR", "—",
            "DKIM selector: the public key is the TXT record at `<selector>._domainkey.<domain>`",
            "—"),
    Setting("DIGEST_DKIM_DOMAIN", "the domain of `DIGEST_FROM_ADDRESS`",
            "signing domain (`d=`): the sender's domain or a parent of it, so DMARC's relaxed alignment holds",
            "—"),
    Setting("DIGEST_PROVIDER_URL", "— (required for `http`)",
            "HTTP email API base URL (`POST {url}/emails`)",
            "—"),
    Setting("DIGEST_PROVIDER_API_KEY", "— (required for `http`)",
            "HTTP email API key (sent to `POST {url}/emails`)",
            "—"),
    Setting("DIGEST_PROVIDER_TIMEOUT_SECONDS", "10",
            "HTTP connect/read/write timeout",
            "0.1 to 3600"),
    Setting("DIGEST_PROVIDER_IDEMPOTENCY_WINDOW_SECONDS", "86400",
            "how long the provider honours an `Idempotency-Key`",
            "1 to 2592000 (30 days)"),
    Setting("DIGEST_FROM_ADDRESS", "`digest@example.com`",
            "sender: one address, optionally with a display name (`Shop <digest@shop.example>`); anything else is refused at start",
            "—"),
    Setting("DIGEST_UNSUBSCRIBE_URL", "`http://127.0.0.1:8025/unsubscribe/{customer_id}?token={token}` (`digest serve`'s default address; a demo ledger only)",
            "one-click unsubscribe link template; outside a demo ledger it must be https on a public host (`https://…/unsubscribe/{customer_id}?token={token}`): a plain-http link, `localhost`, a `.local` or single-label name or a loopback, private or link-local IP is refused at start (Gmail and Yahoo require an https one-click link, RFC 8058)",
            "—"),
    Setting("DIGEST_POSTAL_ADDRESS", "— (a demo ledger shows a marked placeholder)",
            "the sender's postal address (CAN-SPAM), in the footer of both parts of every digest, escaped in HTML; required at start outside a demo ledger",
            "one printable line, at most 200 characters"),
    Setting("DIGEST_MESSAGE_ID_DOMAIN", "the domain of `DIGEST_FROM_ADDRESS`",
            "the domain after the `@` of every `Message-ID` (List-Id and Feedback-ID keep the sender's)",
            "a dotted ASCII hostname (`xn--` form for international names)"),
    Setting("DIGEST_UNSUBSCRIBE_SECRET", "a public demo value",
            'HMAC key of the unsubscribe token: **set it in production**, at least 16 bytes (random). The first process that signs or checks links records a keyed fingerprint of it in the ledger (`secret_fingerprints`: the first 256 bits of HMAC-SHA512(secret, "digest-unsubscribe-fingerprint"), never the secret); `digest run`, `digest sweep`, a Dagster delivery step and `digest serve` refuse any other secret, a shorter one, or the public value on a ledger without `digest seed` demo data. Change it only with `digest rotate-secret`',
            "—"),
    Setting("DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS", "—",
            "the secret the last `digest rotate-secret` replaced: that command needs it (unless `--overlap-weeks 0`), and `digest serve` needs it while the rotation's overlap is open, accepts the links it signed only until then, and refuses one that is not the rotated-out secret",
            "—"),
    Setting("DIGEST_WEBHOOK_SECRETS", "— (no provider trusted: every `/events/…` is 404)",
            "comma-separated `PROVIDER=SECRET` entries, e.g. `resend=whsec_…`; a provider twice during a key rotation",
            "provider: lower-case letters, digits, `_`, `-` (at most 32); secret: `whsec_<base64>` or text, at least 16 bytes"),
    Setting("DIGEST_WEBHOOK_TOLERANCE_SECONDS", "300",
            "replay window of a signed webhook (either direction)",
            "1 to 3600"),
    Setting("DIGEST_RETRY_BASE_SECONDS", "30",
            "first retry delay bound (doubles per attempt, full jitter)",
            "0.001 to 86400 (1 day)"),
    Setting("DIGEST_RETRY_CAP_SECONDS", "3600",
            "largest retry delay; at least the base",
            "0.001 to 2592000 (30 days)"),
    Setting("DIGEST_RETRY_MAX_ATTEMPTS", "10",
            "attempt budget before `max_attempts`",
            "1 to 1000"),
    Setting("DIGEST_RETRY_MAX_AGE_SECONDS", "86400",
            "retry age before `max_age`",
            "1 to 31622400 (366 days)"),
    Setting("DIGEST_LEASE_SECONDS", "120",
            "visibility timeout of a claim",
            "1 to 2592000 (30 days)"),
    Setting("DIGEST_DELIVERY_WINDOW_SECONDS", "604800",
            "how long after the week ends a digest is still sent",
            "1 to 31622400 (366 days)"),
    Setting("DIGEST_UNKNOWN_RETENTION_SECONDS", "604800",
            "how long an `unknown` item waits before `unknown_unresolved`",
            "1 to 31622400 (366 days)"),
    Setting("DIGEST_LATE_WINDOW_SECONDS", "86400",
            "how long an operator's late grant (`digest run --deliver-late`) keeps a missed week deliverable",
            "1 to 31622400 (366 days)"),
    Setting("DIGEST_BATCH_SIZE", "25000",
            'items per delivery step for each of its processes (the fan-out; see "Running at scale")',
            "1 to 1000000"),
    Setting("DIGEST_DELIVERY_PROCESSES", "1",
            'processes that deliver one batch step\'s items: the step\'s own and forked helpers, each with `DIGEST_BATCH_SIZE` items and its own connections; only over PostgreSQL (see "Delivery processes")',
            "1 to 64"),
    Setting("DIGEST_CONCURRENCY", "256 with `DIGEST_MAILER=outbox`, 16 with `smtp` or `http`",
            'sends in flight per step (threads; see "Running at scale")',
            "1 to 1024"),
    Setting("DIGEST_SEND_RATE", "— (unpaced)",
            'messages per second for every sender of the install together, kept in the ledger ("Mailers"); slots are spaced for 95 % of it',
            "0.1 to 10000"),
    Setting("DIGEST_BREAKER_THRESHOLD", "20",
            'consecutive attempts failing with the same class and code (`http:401`, `smtp:535`, `http:422`, …) that stop a delivery run (a step, a sweep); see "Delivery policy"',
            "0 to 1000000 (0: no breaker)"),
    Setting("DIGEST_CLEANUP_MODE", "`archive`",
            "`archive` or `delete`",
            "—"),
    Setting("DIGEST_OPERATORS", "— (anyone, as their own OS user)",
            'comma-separated names allowed to `resolve`, `replay`, `regenerate` and `run --deliver-late`; `NAME=OS_USER` lets that OS user act as NAME (see "Who may act")',
            "—"),
    Setting("DIGEST_EXECUTOR", "`in_process`",
            "where every job's steps run: `in_process`, `multiprocess` (a process per step), `celery` (Celery workers; extra `celery`) or `k8s` (a Kubernetes Job per step; extra `k8s`). Read when the definitions load (as `DIGEST_FIRST_WEEK` is): restart the code server, webserver and daemon after changing it",
            "those four"),
    Setting("DIGEST_FIRST_WEEK", "the earliest week the ledger holds; the latest complete week while it holds none",
            "the first week the weekly job partitions (the partition grid and plots start there); read when the definitions load: restart the code server, webserver and daemon after changing it; `digest run` refuses an earlier week with one line",
            "an ISO week, 2025-W02 or later"),
    Setting("DIGEST_CELERY_BROKER_URL", "— (required for `celery`)",
            "the broker the launcher and every worker use, e.g. `redis://redis.internal:6379/0`",
            "—"),
    Setting("DIGEST_CELERY_BACKEND_URL", "the broker URL for `redis://` / `rediss://`, else `rpc://`",
            "Celery's result backend",
            "—"),
    Setting("DIGEST_LOG_LEVEL", "`WARNING`",
            "the CLI's log level (`DEBUG`, `INFO`, …); lines are `event=… key=<operation key> …`",
            "—"),
    Setting("DIGEST_SERVE_HEADER_TIMEOUT_SECONDS", "10",
            "`digest serve`: time to receive a request head, from the connection's opening or its first byte after an idle spell; then 408 and close",
            "0.1 to 3600"),
    Setting("DIGEST_SERVE_BODY_TIMEOUT_SECONDS", "10",
            "`digest serve`: total time to receive a request body once its head is in (a body trickling a byte at a time is cut too); then 408 and close",
            "0.1 to 3600"),
    Setting("DIGEST_SERVE_KEEP_ALIVE_SECONDS", "10",
            "`digest serve`: how long an idle keep-alive connection is held; keep a pooling proxy's idle limit below it",
            "0.1 to 3600"),
    Setting("DIGEST_SERVE_MAX_CONNECTIONS", "512",
            "`digest serve`: connections held at once; the next is answered 503 (`Retry-After: 1`) and closed; keep it below the process's open-file limit (`ulimit -n`)",
            "1 to 100000"),
    Setting("DIGEST_ALLOW_NONDURABLE_LEDGER", "off",
            '**Unsafe.** Lets `digest run`, `sweep`, `serve` and the Dagster delivery steps use a PostgreSQL ledger whose `fsync` or `synchronous_commit` is `off`. Such a server can lose committed "attempt started" rows in a crash, and a restart then sends those digests again; without this setting each command refuses in one line (exit 2) and each step fails, before anything is recorded. Only for a throwaway ledger: `scripts/pg-test-cluster.sh` sets it for its fsync-off test cluster',
            "`1`/`true`/`yes`, `0`/`false`/`no`"),
)
# fmt: on


def names() -> frozenset[str]:
    """The catalogued variable names."""
    return frozenset(s.name for s in SETTINGS)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """The catalogue as a Markdown table: variable, default, meaning, accepted."""
    rows = ["| variable | default | meaning | accepted |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        cells = (f"`{s.name}`", s.default, s.meaning, s.accepted)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"
