"""`digest serve` from the terminal, and the public demo secret failing closed.

With the default `DIGEST_UNSUBSCRIBE_SECRET`, `digest serve` refuses to start and `digest run`
refuses to send on a ledger `digest seed` never filled, each in one line (exit 2, nothing
recorded); on the demo's ledger both go ahead. The real console script is started once, on a
free port, and stopped with SIGINT as Ctrl-C would.
"""

import socket

import httpx
import pytest

from digest_pipeline.domain.unsubscribe import DEMO_UNSUBSCRIBE_SECRET, unsubscribe_token
from digest_pipeline.rigs.servers.serve_process import ServeProcess
from digest_pipeline_tests.cli.conftest import digest

PRIVATE = {"DIGEST_UNSUBSCRIBE_SECRET": "a-private-secret-for-cli-tests"}


def _one_line(run, command: str) -> str:
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"digest {command}: error: ")
    return str(run.err)


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["serve"], "digest serve"),
        (["run", "--period", "2026-W42"], "digest run"),
        (["sweep"], "digest sweep"),
    ],
)
def test_the_public_secret_is_refused_on_a_ledger_without_demo_data(mixed, argv, what):
    before = mixed.dump()
    public = {"DIGEST_UNSUBSCRIBE_SECRET": DEMO_UNSUBSCRIBE_SECRET}
    line = _one_line(mixed.cli(*argv, env=public), argv[0])
    assert f"{what} refused: DIGEST_UNSUBSCRIBE_SECRET is the public demo value" in line
    assert "demo-unsubscribe-secret" not in line
    assert mixed.dump() == before


def test_a_bad_reason_is_still_refused_as_bad_input_before_the_secret(mixed):
    argv = ["run", "--period", "2026-W42", "--deliver-late", "--reason", "late\x1b[2J"]
    assert "control or format character" in _one_line(mixed.cli(*argv), "run")


@pytest.mark.parametrize("port", ["65536", "-1", "http"])
def test_a_port_out_of_range_is_one_line(mixed, port):
    run = mixed.cli("serve", "--port", port, env=PRIVATE)
    assert run.code == 2
    assert run.err.count("\n") == 1


def test_a_port_in_use_is_one_line_and_exit_1(mixed):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = mixed.cli("serve", "--port", str(port), env=PRIVATE)
    assert run.code == 1
    assert run.err.startswith(f"digest serve: error: cannot listen on 127.0.0.1:{port}: ")
    assert run.err.count("\n") == 1


def test_on_the_demo_ledger_digest_serve_starts_with_the_demo_secret_and_stops_on_sigint(env):
    assert digest(env, "seed", "--customers", "5", "--seed", "3")[0] == 0
    token = unsubscribe_token("demo-unsubscribe-secret", "customer-0002")
    path = f"/unsubscribe/customer-0002?token={token}"
    with ServeProcess({**env, "DIGEST_LOG_LEVEL": "DEBUG"}) as server:
        with httpx.Client(base_url=server.url) as http:
            page = http.get(path)
            done = http.post(path, data={"List-Unsubscribe": "One-Click"})
            forged = http.post(path.replace(token, "0" * 32), data={"List-Unsubscribe": "1"})
        code, log = server.stopped()
    assert (page.status_code, done.status_code, forged.status_code) == (200, 200, 403)
    assert code == 0, log
    assert "digest serve: listening on http://127.0.0.1:" in log
    assert "event=unsubscribed customer_id=customer-0002 source=one_click" in log
    assert log.rstrip().endswith("digest serve: stopped")
    # no access log: the token (a credential) is never written down
    assert token not in log
