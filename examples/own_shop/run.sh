#!/usr/bin/env bash
# Builds the example shop from scratch and runs its latest complete week of its first digest
# through Dagster with the outbox mailer; the last output is `digest status --json` for that week.
# Usage: examples/own_shop/run.sh   (after `make install`; OWN_SHOP_WORK=DIR keeps the files there)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${VENV:-$repo/.venv}/bin
work=${OWN_SHOP_WORK:-$here/.work}

rm -rf "$work"
mkdir -p "$work"
"$bin/python" "$here/make_shop.py" "$work/shop.db"

# the digest's settings are in its YAML (own_shop/defs/*/defs.yaml), which names its files under
# OWN_SHOP_WORK; the environment keeps Dagster's home and the secret
export OWN_SHOP_WORK="$work"
export DAGSTER_HOME="$work/dagster_home"
# a real shop keeps its secret in a secret store; the example makes one per build
DIGEST_UNSUBSCRIBE_SECRET=$("$bin/python" -c 'import secrets; print(secrets.token_hex(32))')
export DIGEST_UNSUBSCRIBE_SECRET

# the same settings for `dagster dev` on this code location (README)
export -p | grep -E ' (DIGEST_[A-Z_]+|DAGSTER_HOME|OWN_SHOP_WORK)=' > "$work/env"

# the shop's own code location (workspace.yaml): its tables and both digests; `--instance`
# names the digest the command works on, and reads that instance's YAML
cd "$here"
"$bin/digest" --instance digest run --period latest
"$bin/digest" --instance digest status --period latest --json
