#!/usr/bin/env bash
# Builds the example shop from scratch and runs its latest complete week of the digest through
# Dagster with the outbox mailer; the last output is `digest status --json` for that week.
# Usage: examples/own_shop/run.sh   (after `make install`; OWN_SHOP_WORK=DIR keeps the files there)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${VENV:-$repo/.venv}/bin
work=${OWN_SHOP_WORK:-$here/.work}

rm -rf "$work"
mkdir -p "$work"
"$bin/python" "$here/make_shop.py" "$work/shop.db"

# the ledger and Dagster's storage are the digest's own; the shop's database is only read
export DIGEST_DATABASE_URL="sqlite:///$work/ledger.db"
export DAGSTER_HOME="$work/dagster_home"
export DIGEST_SOURCE_DATABASE_URL="sqlite:///$work/shop.db"
export DIGEST_SOURCE_CONFIG="$here/shop.yaml"
# the look: one template of the package replaced, the brand from settings
export DIGEST_TEMPLATE_DIR="$here/templates"
export DIGEST_SHOP_NAME="Nordic Goods"
export DIGEST_BRAND_COLOR="#0f766e"
export DIGEST_LOCALE="de_DE"
export DIGEST_FROM_ADDRESS="Nordic Goods <digest@nordic-goods.example>"
export DIGEST_POSTAL_ADDRESS="Nordic Goods GmbH, Hafenstraße 1, 20457 Hamburg, Germany"
export DIGEST_UNSUBSCRIBE_URL="https://nordic-goods.example/unsubscribe/{customer_id}?token={token}"
# a real shop keeps its secret in a secret store; the example makes one per build
DIGEST_UNSUBSCRIBE_SECRET=$("$bin/python" -c 'import secrets; print(secrets.token_hex(32))')
export DIGEST_UNSUBSCRIBE_SECRET
export DIGEST_MAILER=outbox
export DIGEST_OUTBOX_DIR="$work/outbox"

# the same settings for `dagster dev` on this code location (README)
export -p | grep -E ' (DIGEST_[A-Z_]+|DAGSTER_HOME)=' > "$work/env"

# the shop's own code location (workspace.yaml): its tables and the digest's graph
cd "$here"
"$bin/digest" run --period latest
"$bin/digest" status --period latest --json
