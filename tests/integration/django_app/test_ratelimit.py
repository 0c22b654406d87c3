"""The sliding-window rate limiter (docs/ratelimit.md): R1 a hit is admitted only while
the estimate stays within the limit, under any concurrency; R2 a refused hit writes
nothing; R3 a refusal's retry-after is exact (the first ms the estimate admits again);
R4 ``@rate_limit`` answers 429 with ``Retry-After`` on sync and async views, without
running them; R5 hits count per scope and key, and X-Forwarded-For is read only from
trusted proxies; R6 an unreachable Redis fails open (ERROR log) or closed (503).

Covers ratelimit.lua, with its race: 200 concurrent requests against a live server.
Positions in a window are read from the Redis clock (TIME), as the script reads them;
tests wait for real window boundaries, nothing fakes time.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import AsyncClient, RequestFactory, override_settings
from django.utils.decorators import method_decorator
from django.views import View

from relier_django import conf
from relier_django import ratelimit as django_ratelimit
from relier_django.core.extras.ratelimit import Rate, hit
from relier_django.core.store.connection import close_loop_clients
from relier_django.core.store.keys import KeySpace
from relier_django.ratelimit import rate_limit
from testproject.harness import free_port
from tests import ratelimit_urls

KEYS = KeySpace("rl")
SECOND = 1000  # ms: the window of the script-level tests
MINUTE = 60_000
URLS = pytest.mark.urls("tests.ratelimit_urls")


def server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def place(client, window_ms: int, at_ms: int, below_ms: int, *, after: int = -1) -> int:
    """Sleep until the Redis clock is in [at_ms, below_ms) of a window whose index is
    above ``after``; return that window's index."""
    for _ in range(3):
        now = server_ms(client)
        index, elapsed = divmod(now, window_ms)
        if index > after and at_ms <= elapsed < below_ms:
            return index
        start = index if index > after and elapsed < at_ms else index + 1
        time.sleep((start * window_ms + at_ms + 2 - now) / 1000)
    raise AssertionError("could not place the test in the window it needs")


def one_hit(client, rate: Rate, scope: str = "t", key: str = "k"):
    return hit(KEYS, scope, key, rate).run(client)


def limiter_keys(client) -> set[str]:
    return {k.decode() for k in client.scan_iter(match="rl:rl:*")}


# -- R1, R3: the script's arithmetic ---------------------------------------------------
def test_five_pass_the_sixth_waits_exactly_until_the_window_has_slid(redis_client):
    rate = Rate.parse("5/s")
    index = place(redis_client, SECOND, 300, 600)
    passed = [one_hit(redis_client, rate) for _ in range(5)]
    assert [(d.allowed, d.remaining) for d in passed] == [(True, n) for n in (4, 3, 2, 1, 0)]
    before = server_ms(redis_client)
    refused = one_hit(redis_client, rate)
    after = server_ms(redis_client)
    assert before // SECOND == after // SECOND == index
    assert not refused.allowed and refused.remaining == 0
    # c = 5 = limit: not in this window. In the next, p = 5 weighs 5 * (1 - e2/W), which
    # leaves room for one from e2 = W/5: the wait is (W - e) + 200 ms.
    assert 1200 - after % SECOND <= refused.retry_after_s * 1000 <= 1200 - before % SECOND
    assert 0 < refused.retry_after_s <= 1.0
    time.sleep(refused.retry_after_s - 0.25)
    assert not one_hit(redis_client, rate).allowed  # 250 ms early: still refused
    time.sleep(0.25)
    readmitted = one_hit(redis_client, rate)
    assert readmitted.allowed and readmitted.remaining == 0


def test_a_burst_at_a_windows_start_waits_more_than_a_window(redis_client):
    # The honest cost of the approximation: it assumes the previous window's hits were
    # spread evenly, so hits made at its very start still weigh after they are 1 s old.
    rate = Rate.parse("5/s")
    place(redis_client, SECOND, 20, 150)
    assert all(one_hit(redis_client, rate).allowed for _ in range(5))
    before = server_ms(redis_client)
    refused = one_hit(redis_client, rate)
    after = server_ms(redis_client)
    assert 1200 - after % SECOND <= refused.retry_after_s * 1000 <= 1200 - before % SECOND
    assert refused.retry_after_s > 1.0


def test_the_previous_window_counts_by_the_share_it_still_overlaps(redis_client):
    rate = Rate(10, 1)
    filled = place(redis_client, SECOND, 100, 700)
    assert all(one_hit(redis_client, rate).allowed for _ in range(10))
    assert place(redis_client, SECOND, 450, 650, after=filled) == filled + 1
    before = server_ms(redis_client)
    burst = [one_hit(redis_client, rate) for _ in range(12)]
    after = server_ms(redis_client)
    assert before // SECOND == after // SECOND == filled + 1

    def admissible(elapsed: int) -> int:  # the n with p*(W - e) + n*W <= limit*W
        return (10 * SECOND - 10 * (SECOND - elapsed)) // SECOND

    admitted = sum(d.allowed for d in burst)
    assert admissible(before % SECOND) <= admitted <= admissible(after % SECOND)
    assert 4 <= admitted <= 6  # about half of the previous window still weighs
    stored = redis_client.hgetall(KEYS.ratelimit("t", "k"))
    assert stored == {b"w": str(filled + 1).encode(), b"c": str(admitted).encode(), b"p": b"10"}
    # The first refusal: room for one once 10 * (W - e2) <= (9 - c) * W.
    first = next(i for i, d in enumerate(burst) if not d.allowed)
    counted = sum(d.allowed for d in burst[:first])
    wait = burst[first].retry_after_s * 1000

    def expected(elapsed: int) -> int:
        return SECOND - (9 - counted) * SECOND // 10 - elapsed

    assert expected(after % SECOND) <= wait <= expected(before % SECOND)


def test_after_two_idle_windows_the_whole_limit_is_available_again(redis_client):
    rate = Rate(2, 1)
    filled = place(redis_client, SECOND, 0, 700)
    assert [one_hit(redis_client, rate).allowed for _ in range(3)] == [True, True, False]
    place(redis_client, SECOND, 0, 700, after=filled + 1)
    assert [one_hit(redis_client, rate).allowed for _ in range(3)] == [True, True, False]
    assert redis_client.hget(KEYS.ratelimit("t", "k"), "p") == b"0"


# -- R2: a refusal writes nothing ------------------------------------------------------
def test_a_refused_hit_writes_nothing(redis_client):
    rate = Rate.parse("3/h")
    key = KEYS.ratelimit("t", "k")
    assert all(one_hit(redis_client, rate).allowed for _ in range(3))
    stored, ttl = redis_client.hgetall(key), redis_client.pttl(key)
    assert 0 < ttl <= 2 * 3600 * 1000
    refusals = [one_hit(redis_client, rate) for _ in range(20)]
    assert not any(d.allowed for d in refusals)
    assert all(d.retry_after_s > 0 for d in refusals)
    assert redis_client.hgetall(key) == stored
    assert redis_client.pttl(key) <= ttl  # not renewed either


# -- R5 at the script: one key per (scope, key) ----------------------------------------
def test_each_scope_and_key_is_its_own_limiter_with_one_expiring_key(redis_client):
    rate = Rate.parse("1/m")
    assert one_hit(redis_client, rate, "a", "x").allowed
    assert not one_hit(redis_client, rate, "a", "x").allowed
    assert one_hit(redis_client, rate, "a", "y").allowed
    assert one_hit(redis_client, rate, "b", "x").allowed
    expected = {KEYS.ratelimit("a", "x"), KEYS.ratelimit("a", "y"), KEYS.ratelimit("b", "x")}
    assert limiter_keys(redis_client) == expected
    assert all(0 < redis_client.pttl(k) <= 2 * MINUTE for k in expected)
    assert all(k.startswith("rl:rl:{") and k.endswith("}") for k in expected)


# -- R1 under concurrency: the race, end to end ----------------------------------------
@URLS
def test_200_concurrent_requests_from_16_threads_let_exactly_50_through(live_server, redis_client):
    # Exactly 50 because the run stays inside one fixed minute with an empty previous
    # one: there the estimate is the exact count. Start with >= 10 s of the minute left.
    index = place(redis_client, MINUTE, 0, 50_000)

    def status(_: int) -> int:
        try:
            with urllib.request.urlopen(f"{live_server.url}/live/", timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as refused:
            refused.close()
            return refused.code

    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = Counter(pool.map(status, range(200)))
    assert server_ms(redis_client) // MINUTE == index, "the run crossed a minute boundary"
    assert statuses == {200: 50, 429: 150}
    assert redis_client.hget(KEYS.ratelimit("tests.live", "ip:127.0.0.1"), "c") == b"50"


# -- R4: the decorator on sync and async views -----------------------------------------
def _must_not_be_called(*_: object) -> None:
    raise AssertionError("the wrong client kind for this view")


@URLS
def test_a_sync_view_over_its_limit_answers_429_and_does_not_run(client, redis_client, monkeypatch):
    monkeypatch.setattr(django_ratelimit, "async_client", _must_not_be_called)
    ratelimit_urls.CALLS.clear()
    ok = [client.get("/sync/") for _ in range(2)]
    assert [r.status_code for r in ok] == [200, 200] and ok[0].content == b"sync ok"
    refused = client.get("/sync/")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 90  # whole seconds, rounded up
    assert refused.content.decode().startswith("Too many requests")
    assert ratelimit_urls.CALLS["sync"] == 2
    scope = "tests.ratelimit_urls.sync_view"  # the default scope: the view's dotted name
    assert limiter_keys(redis_client) == {KEYS.ratelimit(scope, "ip:127.0.0.1")}


@URLS
def test_an_async_view_over_its_limit_answers_429_and_does_not_run(redis_client, monkeypatch):
    monkeypatch.setattr(django_ratelimit, "sync_client", _must_not_be_called)
    assert iscoroutinefunction(ratelimit_urls.async_view)
    ratelimit_urls.CALLS.clear()

    async def main() -> list[HttpResponse]:
        try:
            client = AsyncClient()
            return [await client.get("/async/") for _ in range(3)]
        finally:
            await close_loop_clients()

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].content == b"async ok"
    assert 1 <= int(responses[2]["Retry-After"]) <= 90
    assert ratelimit_urls.CALLS["async"] == 2


# -- R5: whose hits count together -----------------------------------------------------
def _ok(request) -> HttpResponse:
    return HttpResponse("ok")


def _request(ip: str = "198.51.100.1", user: object | None = None, **headers: str):
    request = RequestFactory().get("/", REMOTE_ADDR=ip, **headers)
    request.user = user if user is not None else AnonymousUser()
    return request


def _bucket_of(redis_client, view, request, scope: str) -> str:
    """Send ``request`` to ``view`` and return the bucket it counted in (one of a
    few candidates, found through its key)."""
    redis_client.flushall()
    assert view(request).status_code == 200
    candidates = [
        "user:anonymous", "user:7", "user:8", "ip:198.51.100.1", "ip:198.51.100.2",
        "custom-A", "custom-B",
    ]  # fmt: skip
    found = [c for c in candidates if redis_client.exists(KEYS.ratelimit(scope, c))]
    assert len(found) == 1 and limiter_keys(redis_client) == {KEYS.ratelimit(scope, found[0])}
    return found[0]


def test_keys_ip_user_user_or_ip_and_a_callable_pick_the_bucket(redis_client):
    alice, bob = (
        SimpleNamespace(is_authenticated=True, pk=7),
        SimpleNamespace(is_authenticated=True, pk=8),
    )
    by_ip = rate_limit("5/m", key="ip", scope="k.ip")(_ok)
    by_user = rate_limit("5/m", key="user", scope="k.user")(_ok)
    either = rate_limit("5/m", key="user_or_ip", scope="k.either")(_ok)
    custom = rate_limit("5/m", key=lambda r: r.headers["X-Api-Key"], scope="k.fn")(_ok)

    def bucket(view, request, scope: str) -> str:
        return _bucket_of(redis_client, view, request, scope)

    assert bucket(by_ip, _request("198.51.100.2", alice), "k.ip") == "ip:198.51.100.2"
    assert bucket(by_user, _request(user=alice), "k.user") == "user:7"
    assert bucket(by_user, _request(user=bob), "k.user") == "user:8"
    # key="user": anonymous requests from any address share one bucket.
    assert bucket(by_user, _request("198.51.100.2"), "k.user") == "user:anonymous"
    assert bucket(either, _request(user=alice), "k.either") == "user:7"
    assert bucket(either, _request("198.51.100.2"), "k.either") == "ip:198.51.100.2"
    api_b = _request(HTTP_X_API_KEY="custom-B")
    assert bucket(custom, api_b, "k.fn") == "custom-B"


def test_an_async_view_reads_the_user_through_auser(redis_client):
    async def view(request) -> HttpResponse:
        return HttpResponse("ok")

    limited = rate_limit("1/m", key="user")(view)
    request = _request()
    del request.user  # touching request.user in the loop would be a sync DB call

    async def auser() -> object:
        return SimpleNamespace(is_authenticated=True, pk=7)

    request.auser = auser

    async def main() -> list[int]:
        try:
            return [(await limited(request)).status_code for _ in range(2)]
        finally:
            await close_loop_clients()

    assert asyncio.run(main()) == [200, 429]
    scope = f"{view.__module__}.{view.__qualname__}"
    assert limiter_keys(redis_client) == {KEYS.ratelimit(scope, "user:7")}


def test_user_keys_without_the_auth_middleware_are_a_clear_error(redis_client):
    limited = rate_limit("1/m", key="user_or_ip", scope="k.nomw")(_ok)
    with pytest.raises(ImproperlyConfigured, match="AuthenticationMiddleware"):
        limited(RequestFactory().get("/"))
    bad = rate_limit("1/m", key=lambda r: None, scope="k.none")(_ok)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="non-empty str"):
        bad(_request())


class _Report(View):
    def get(self, request) -> HttpResponse:
        return HttpResponse("ok")


@method_decorator(rate_limit("1/m", key="ip"), name="dispatch")
class _First(_Report):
    pass


@method_decorator(rate_limit("1/m", key="ip"), name="dispatch")
class _Second(_Report):
    pass


def test_class_based_views_get_a_limiter_per_class_by_default(redis_client):
    # Both inherit View.dispatch, and every as_view() function has the same name: the
    # default scope must come from the class, or all of them would share one limiter.
    first, second = _First.as_view(), _Second.as_view()
    wrapped = rate_limit("1/m", key="ip")(_Report.as_view())
    views = (first, first, second, wrapped, wrapped)
    assert [v(_request()).status_code for v in views] == [200, 429, 200, 200, 429]
    scopes = (f"{__name__}._First.dispatch", f"{__name__}._Second.dispatch", f"{__name__}._Report")
    assert limiter_keys(redis_client) == {KEYS.ratelimit(s, "ip:198.51.100.1") for s in scopes}


@URLS
@pytest.mark.django_db
def test_a_logged_in_user_is_counted_by_pk_whatever_the_address(
    client, redis_client, django_user_model
):
    user = django_user_model.objects.create_user("ratelimited", password="pw")
    client.force_login(user)
    assert client.get("/by-user/", REMOTE_ADDR="198.51.100.1").status_code == 200
    assert client.get("/by-user/", REMOTE_ADDR="198.51.100.2").status_code == 429
    assert limiter_keys(redis_client) == {KEYS.ratelimit("tests.by_user", f"user:{user.pk}")}


@URLS
def test_x_forwarded_for_is_read_from_the_right_behind_a_trusted_proxy(client, redis_client):
    trusted = {**settings.RELIER, "TRUSTED_PROXIES": ["10.0.0.0/8", "192.0.2.1"]}
    with override_settings(RELIER=trusted):
        # Client -> 192.0.2.1 -> 10.1.2.3 -> Django. The left entry is whatever the
        # client sent; changing it does not get a fresh bucket.
        via = {"REMOTE_ADDR": "10.1.2.3"}
        first = client.get("/by-ip/", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.9, 192.0.2.1", **via)
        again = client.get("/by-ip/", HTTP_X_FORWARDED_FOR="7.7.7.7, 203.0.113.9, 192.0.2.1", **via)
    assert (first.status_code, again.status_code) == (200, 429)
    assert limiter_keys(redis_client) == {KEYS.ratelimit("tests.by_ip", "ip:203.0.113.9")}


@URLS
def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(client, redis_client):
    with override_settings(RELIER={**settings.RELIER, "TRUSTED_PROXIES": ["10.0.0.0/8"]}):
        peer = {"REMOTE_ADDR": "198.51.100.7"}
        first = client.get("/by-ip/", HTTP_X_FORWARDED_FOR="203.0.113.9", **peer)
        other = client.get("/by-ip/", HTTP_X_FORWARDED_FOR="203.0.113.10", **peer)
    assert (first.status_code, other.status_code) == (200, 429)
    assert limiter_keys(redis_client) == {KEYS.ratelimit("tests.by_ip", "ip:198.51.100.7")}


# -- R6: Redis unreachable -------------------------------------------------------------
@URLS
@pytest.mark.parametrize(("fail_open", "status"), [(True, 200), (False, 503)])
def test_redis_unreachable_fails_open_with_an_error_log_or_closed_with_503(
    client, monkeypatch, caplog, fail_open, status
):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    relier = {**settings.RELIER, "REDIS_URL": url, "RATELIMIT_FAIL_OPEN": fail_open}
    # RELIER_REDIS_URL (set for the session's Redis) wins over settings.RELIER.
    with monkeypatch.context() as mp:
        mp.setenv("RELIER_REDIS_URL", url)
        with override_settings(RELIER=relier), caplog.at_level("ERROR"):
            response = client.get("/by-ip/")
    conf.get_config.cache_clear()
    assert response.status_code == status
    assert "rate limiter unavailable" in caplog.text
    assert "scope=tests.by_ip reason=ConnectionError" in caplog.text


@URLS
def test_redis_unreachable_from_an_async_view_fails_closed_when_configured(monkeypatch, caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"
    relier = {**settings.RELIER, "REDIS_URL": url, "RATELIMIT_FAIL_OPEN": False}
    ratelimit_urls.CALLS.clear()

    async def main() -> HttpResponse:
        try:
            return await AsyncClient().get("/async/")
        finally:
            await close_loop_clients()

    with monkeypatch.context() as mp:
        mp.setenv("RELIER_REDIS_URL", url)
        with override_settings(RELIER=relier), caplog.at_level("ERROR"):
            response = asyncio.run(main())
    conf.get_config.cache_clear()
    assert response.status_code == 503 and ratelimit_urls.CALLS["async"] == 0
    assert "request refused with 503: scope=tests.ratelimit_urls.async_view" in caplog.text
