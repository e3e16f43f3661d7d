#!/usr/bin/env bash
# Install the Debian tools the integration tier drives besides PostgreSQL and Redis.
#
# Usage: scripts/debian-test-tools.sh
#
#   postfix       for /usr/sbin/smtp-sink, an independent SMTP peer with scripted faults
#                 (digest_pipeline/rigs/servers/smtp_sink.py); the postfix service is never
#                 configured nor started
#   spamassassin  for `spamassassin -L -t`, which scores a rendered digest with local rules only
#   chromium      run headless by the browser tests of the Dagster UI
#                 (digest_pipeline/rigs/servers/browser.py): Debian's build, since no test may
#                 download a browser of its own
#   chromium-driver  its chromedriver, through which Selenium drives it
#
# Installs only what is missing, and only as root (as CI runs): without root it says in one
# line what is missing and exits 0, so the tests that need a tool skip locally (and fail under
# CI=true). While installing, a policy-rc.d that exits 101 keeps every package's service from
# starting; any existing policy-rc.d is moved aside and put back afterwards.
# All of this script's messages go to stderr.
set -euo pipefail

readonly PROG="debian-test-tools"
SELF="$(readlink -f "${BASH_SOURCE[0]}")"
readonly SELF

# shellcheck source=lib/throwaway-service.sh
source "$(dirname "$SELF")/lib/throwaway-service.sh"

case "${1:-}" in
    -h | --help)
        sed -n '2,19s/^# \{0,1\}//p' "$SELF" >&2
        exit 0
        ;;
    "") ;;
    *)
        log "unexpected argument: $1 (see --help)"
        exit 2
        ;;
esac

# package → the file that shows it is installed (smtp-sink is in /usr/sbin, off a user's PATH)
has_smtp_sink() { [[ -x /usr/sbin/smtp-sink ]] || command -v smtp-sink >/dev/null; }
has_spamassassin() { command -v spamassassin >/dev/null || [[ -x /usr/bin/spamassassin ]]; }
has_chromium() { command -v chromium >/dev/null || [[ -x /usr/bin/chromium ]]; }
has_chromedriver() { command -v chromedriver >/dev/null || [[ -x /usr/bin/chromedriver ]]; }

missing=()
has_smtp_sink || missing+=(postfix)
has_spamassassin || missing+=(spamassassin)
has_chromium || missing+=(chromium)
has_chromedriver || missing+=(chromium-driver)
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null; then
    log "not installing ${missing[*]} (needs root and apt-get); the tests that use them skip"
    exit 0
fi

# shellcheck source=lib/apt-without-services.sh
source "$(dirname "$SELF")/lib/apt-without-services.sh"

trap 'exit 130' INT
trap 'exit 143' TERM

log "installing Debian's ${missing[*]} (no service is started)"
# postfix asks which kind of mail system this is; "No configuration" writes no main.cf, so
# nothing could deliver mail even if the service were started. smtp-sink needs none.
if [[ " ${missing[*]} " == *" postfix "* ]]; then
    echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
fi
apt_install_without_services "${missing[@]}"

# Belt and braces: if a service this install brought started anyway (an init system that
# ignores the policy), stop it.
if command -v service >/dev/null; then
    for pkg in "${missing[@]}"; do
        case "$pkg" in
            postfix) service postfix stop >/dev/null 2>&1 || true ;;
            spamassassin) service spamd stop >/dev/null 2>&1 || true ;;
        esac
    done
fi

has_smtp_sink || die "smtp-sink still not found after installing postfix"
has_spamassassin || die "spamassassin still not found after installing spamassassin"
has_chromium || die "chromium still not found after installing chromium"
has_chromedriver || die "chromedriver still not found after installing chromium-driver"
log "installed ${missing[*]}"
