# Sourced by the test scripts: `apt_install_without_services PKG...` installs Debian packages
# while a policy-rc.d that exits 101 keeps every package's service from starting (invoke-rc.d
# and deb-systemd-invoke ask it). Any existing policy-rc.d is moved aside for the install and
# put back afterwards, also when the install fails or the script is interrupted (EXIT trap).
# The sourcing script defines `log`, `die` and `SELF`, and runs as root.

readonly POLICY_RC=/usr/sbin/policy-rc.d
POLICY_SAVED=""
POLICY_OURS=0

# Put back whatever /usr/sbin/policy-rc.d was there before the install. Never fails.
restore_policy_rc() {
    if [[ "$POLICY_OURS" -eq 1 ]]; then
        rm -f -- "$POLICY_RC"
        POLICY_OURS=0
    fi
    if [[ -n "$POLICY_SAVED" ]]; then
        mv -f -- "$POLICY_SAVED" "$POLICY_RC" ||
            log "could not restore $POLICY_RC from $POLICY_SAVED"
        POLICY_SAVED=""
    fi
}

apt_install_without_services() {
    export DEBIAN_FRONTEND=noninteractive
    trap restore_policy_rc EXIT
    if [[ -e "$POLICY_RC" || -L "$POLICY_RC" ]]; then
        POLICY_SAVED="$POLICY_RC.digest-saved.$$"
        mv -f -- "$POLICY_RC" "$POLICY_SAVED"
    fi
    POLICY_OURS=1
    printf '#!/bin/sh\n# Temporary, from %s: start no services.\nexit 101\n' "$SELF" >"$POLICY_RC"
    chmod 755 "$POLICY_RC"
    apt-get update >&2 || die "apt-get update failed"
    apt-get install -y --no-install-recommends "$@" >&2 || die "apt-get install $* failed"
    restore_policy_rc
    trap - EXIT
}
