"""A real shop's ledger refuses to send or serve without a public https link and a postal address.

`digest run`, `sweep` and `serve` on a ledger `digest seed` never filled stop with one line
naming `DIGEST_UNSUBSCRIBE_URL` (plain http, or a loopback host) or `DIGEST_POSTAL_ADDRESS`
(unset), exit 2, and change nothing recorded: not the ledger, not the outbox, not even the
secret's first fingerprint. On the demo's ledger the loopback link and no address go ahead
(`test_cli.py`, `test_serve_cli.py`).
"""

import pytest

from digest_pipeline.domain.fingerprints import UNSUBSCRIBE

COMMANDS = [["run", "--period", "2026-W42"], ["sweep"], ["serve"]]
LOOPBACK = "http://127.0.0.1:8025/unsubscribe/{customer_id}?token={token}"


def _one_line(run, command: str) -> str:
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"digest {command}: error: digest {command} refused: ")
    return str(run.err)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DIGEST_UNSUBSCRIBE_URL": LOOPBACK}, "DIGEST_UNSUBSCRIBE_URL must start with https://"),
        # what `digest serve` listens on by default, behind https: still no provider reaches it
        (
            {"DIGEST_UNSUBSCRIBE_URL": LOOPBACK.replace("http:", "https:")},
            "DIGEST_UNSUBSCRIBE_URL names host 127.0.0.1, a loopback address",
        ),
        ({"DIGEST_POSTAL_ADDRESS": ""}, "DIGEST_POSTAL_ADDRESS is not set"),
    ],
    ids=["http-loopback", "https-loopback", "no-address"],
)
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_a_real_shops_ledger_refuses_to_start_and_changes_nothing(mixed, argv, env, says):
    before, mail = mixed.dump(), mixed.outbox_files()

    line = _one_line(mixed.cli(*argv, env=env), argv[0])

    assert says in line
    assert mixed.dump() == before
    assert mixed.outbox_files() == mail
    assert mixed.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None
