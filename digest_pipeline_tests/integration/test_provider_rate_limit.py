"""The loopback provider's rate limit and daily quota, over real HTTP (no PostgreSQL: default suite).

The rate limit is a sliding second over every `POST /emails` arrival, refused ones included (as
Resend counts every request): in no 1.0 s window does it accept more than R, a concurrent burst
gets exactly R through, and the window frees a second after the arrivals that filled it. The
quota refuses every send after Q stored messages, however many arrive at once.
"""

import threading
import time
from collections.abc import Callable, Sequence

import httpx
import pytest

from digest_pipeline.rigs.servers.provider_server import ProviderServer

RATE_HEADERS = ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset")


class ManualClock:
    """The server's clock, moved by the test: arrivals land exactly where the test says."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def post(server: ProviderServer, key: str, client: httpx.Client | None = None) -> httpx.Response:
    payload = {"from": "digest@example.com", "to": ["a@example.test"], "subject": key}
    headers = {"Authorization": f"Bearer {server.api_key}", "Idempotency-Key": key}
    send = client.post if client is not None else httpx.post
    return send(f"{server.url}/emails", json=payload, headers=headers, timeout=10.0)


def concurrently(count: int, request: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """`count` requests started together from their own threads (and connections)."""
    start = threading.Barrier(count)
    answers: list[httpx.Response | None] = [None] * count

    def one(n: int) -> None:
        start.wait(timeout=10)
        answers[n] = request(n)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(a is not None for a in answers), "a request did not finish"
    return [a for a in answers if a is not None]


def most_in_any_window(times: Sequence[float], width: float = 1.0) -> int:
    """The most of `times` inside any half-open window [t, t + width), over every start t."""
    ordered = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(ordered):
        while t - ordered[first] >= width:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class TestRateLimit:
    @pytest.mark.parametrize("rate", [1, 5, 10])
    def test_a_concurrent_burst_of_three_times_the_limit_admits_exactly_the_limit(
        self, clock: ManualClock, rate: int
    ):
        with ProviderServer(rate_limit=rate, clock=clock) as server:
            answers = concurrently(3 * rate, lambda n: post(server, f"burst-{n}"))
            stats = server.stats()
            assert server.handler_errors == 0

        codes = sorted(a.status_code for a in answers)
        assert codes == [200] * rate + [429] * (2 * rate)
        refused = [a for a in answers if a.status_code == 429]
        for a in refused:
            assert a.json() == {
                "statusCode": 429,
                "name": "rate_limit_exceeded",
                "message": a.json()["message"],
            }
            assert a.headers["Retry-After"] == "1"
            assert a.headers["ratelimit-limit"] == str(rate)
            assert a.headers["ratelimit-remaining"] == "0"
            assert a.headers["ratelimit-reset"] == "1"
        assert (stats.requests, stats.accepted, stats.stored) == (3 * rate, rate, rate)
        assert (stats.rate_limited, stats.quota_refused) == (2 * rate, 0)

    def test_the_window_frees_exactly_one_second_after_the_arrivals_that_filled_it(
        self, clock: ManualClock
    ):
        with ProviderServer(rate_limit=2, clock=clock) as server:
            assert [post(server, f"k{n}").status_code for n in range(3)] == [200, 200, 429]
            clock.now += 0.999
            assert post(server, "k3").status_code == 429
            # 1.0 s after the first three the window holds only k3's arrival
            clock.now += 0.001
            assert post(server, "k4").status_code == 200
            assert server.stats().rate_limited == 2

    def test_refused_arrivals_count_against_the_window(self, clock: ManualClock):
        with ProviderServer(rate_limit=2, clock=clock) as server:
            start = clock.now
            assert [post(server, f"k{n}").status_code for n in range(2)] == [200, 200]
            clock.now = start + 0.5
            assert post(server, "refused").status_code == 429
            clock.now = start + 1.2
            assert post(server, "k2").status_code == 200
            # the refusal at +0.5 s still fills the window with k2: a limit counting only
            # accepted requests would take this one
            clock.now = start + 1.3
            assert post(server, "k3").status_code == 429

    def test_every_answer_carries_the_rate_limit_headers(self, clock: ManualClock):
        with ProviderServer(rate_limit=3, clock=clock) as server:
            first, second = post(server, "k1"), post(server, "k2")
            invalid = httpx.post(f"{server.url}/emails", json={}, headers={}, timeout=10.0)

        assert first.status_code == 200
        assert {h: first.headers[h] for h in RATE_HEADERS} == {
            "ratelimit-limit": "3",
            "ratelimit-remaining": "2",
            "ratelimit-reset": "1",
        }
        assert second.headers["ratelimit-remaining"] == "1"
        assert "Retry-After" not in second.headers
        assert invalid.status_code == 401
        assert invalid.headers["ratelimit-remaining"] == "0"

    def test_no_limit_means_no_rate_limit_headers(self):
        with ProviderServer() as server:
            answers = concurrently(20, lambda n: post(server, f"k{n}"))
            stats = server.stats()

        assert {a.status_code for a in answers} == {200}
        assert not any(h in answers[0].headers for h in RATE_HEADERS)
        assert (stats.requests, stats.accepted, stats.rate_limited) == (20, 20, 0)

    def test_no_one_second_window_ever_holds_more_than_the_limit_under_load(self):
        rate, seconds, clients = 5, 2.5, 3
        seen_ok: list[float] = []
        refusals: list[httpx.Response] = []
        lock = threading.Lock()
        with ProviderServer(rate_limit=rate) as server:
            deadline = time.monotonic() + seconds

            def hammer(n: int) -> None:
                with httpx.Client() as client:
                    i = 0
                    while time.monotonic() < deadline:
                        answer = post(server, f"c{n}-{i}", client)
                        with lock:
                            if answer.status_code == 200:
                                seen_ok.append(time.monotonic())
                            else:
                                refusals.append(answer)
                        i += 1
                        time.sleep(0.01)

            threads = [threading.Thread(target=hammer, args=(n,)) for n in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            stats = server.stats()
            assert server.handler_errors == 0

        assert stats.accepted == len(seen_ok)
        # the server's arrival times (time.monotonic): never more than R in any 1.0 s window,
        # and the limit was really reached
        assert most_in_any_window(stats.accepted_at) == rate
        assert stats.accepted <= rate * (seconds + 1)
        assert stats.rate_limited == len(refusals) > stats.accepted
        assert stats.requests == stats.accepted + stats.rate_limited
        assert {(r.status_code, r.headers["Retry-After"]) for r in refusals} == {(429, "1")}


class TestDailyQuota:
    def test_every_send_after_the_quota_is_refused_without_retry_after(self):
        with ProviderServer(daily_quota=3) as server:
            answers = [post(server, f"k{n}") for n in range(5)]
            stats = server.stats()

        assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
        for a in answers[3:]:
            assert a.json()["name"] == "daily_quota_exceeded"
            assert a.json()["statusCode"] == 429
            assert "Retry-After" not in a.headers
        assert (stats.stored, stats.accepted, stats.quota_refused) == (3, 3, 2)
        assert sorted(server.stored) == ["k0", "k1", "k2"]

    def test_concurrent_sends_never_overshoot_the_quota(self):
        with ProviderServer(daily_quota=4) as server:
            answers = concurrently(16, lambda n: post(server, f"k{n}"))
            stats = server.stats()
            assert server.handler_errors == 0

        assert sorted(a.status_code for a in answers) == [200] * 4 + [429] * 12
        assert (stats.stored, stats.quota_refused, stats.rate_limited) == (4, 12, 0)


@pytest.mark.parametrize(
    ("times", "most"),
    [
        ([], 0),
        ([0.0, 0.5, 0.999], 3),
        ([0.0, 1.0, 2.0], 1),  # a window is half-open: an arrival 1.0 s later is outside it
        ([0.0, 0.9, 1.0, 1.8], 3),
    ],
)
def test_most_in_any_window_counts_every_window(times, most):
    assert most_in_any_window(times) == most
