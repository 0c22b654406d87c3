"""The pipelined connection behind ``admission.acheck``, on real redis-servers.

Pipelining is only correct if replies stay matched to their callers: these tests
check exact counting under concurrency, error replies, a late reply after a timeout,
NOSCRIPT after a flush, a restart, AUTH/SELECT, and that loops never share a socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import signal
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import redis.exceptions

from relier_django.core.model.config import Config
from relier_django.core.model.rates import Rate
from relier_django.core.push import admission
from relier_django.core.store import pipelined
from relier_django.core.store.keys import KeySpace
from testproject.harness import redis_server

KEYS = KeySpace("rl")
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, closing the loop's pipelined connection before the loop goes."""

    async def main() -> T:
        try:
            return await coro
        finally:
            pipelined.close_loop()

    return asyncio.run(main())


def _gate(rate: str) -> tuple[admission.Limit, ...]:
    return (admission.Limit(KEYS.admission_all, Rate.parse(rate)),)


def test_concurrent_checks_on_one_connection_count_exactly(redis_server, redis_client):
    cfg = Config(redis_url=redis_server.url)

    async def main() -> list[bool]:
        results = await asyncio.gather(*(admission.acheck(_gate("50/m"), cfg) for _ in range(200)))
        conns = {id(await pipelined.for_loop(cfg)) for _ in range(3)}
        assert len(conns) == 1  # one socket served all 200
        return [r.admitted for r in results]

    admitted = run(main())
    assert admitted.count(True) == 50
    assert redis_client.get(KEYS.admission_all) == b"50"  # refusals counted nowhere


def test_refusal_carries_retry_after_from_the_live_ttl(redis_server, redis_client):
    cfg = Config(redis_url=redis_server.url)

    async def main() -> admission.Admission:
        assert (await admission.acheck(_gate("1/m"), cfg)).admitted
        return await admission.acheck(_gate("1/m"), cfg)

    refused = run(main())
    assert not refused.admitted
    assert 59 < refused.retry_after_s <= 60


def test_an_error_reply_goes_to_its_caller_and_later_replies_stay_matched(
    redis_server, redis_client
):
    cfg = Config(redis_url=redis_server.url)
    redis_client.hset(KEYS.admission_all, "x", "1")  # INCR on a hash: WRONGTYPE
    other = admission.Limit(KEYS.admission_task("t"), Rate.parse("5/m"))

    async def main() -> None:
        bad = admission.acheck(_gate("5/m"), cfg)
        good = admission.acheck((other,), cfg)
        outcomes = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(outcomes[0], redis.exceptions.ResponseError)
        assert "WRONGTYPE" in str(outcomes[0])
        assert outcomes[1] == admission.Admission(True, 0.0)
        assert (await admission.acheck((other,), cfg)).admitted

    run(main())
    assert redis_client.get(KEYS.admission_task("t")) == b"2"


def test_noscript_after_a_flush_falls_back_to_eval(redis_server, redis_client):
    cfg = Config(redis_url=redis_server.url)

    async def main() -> None:
        assert (await admission.acheck(_gate("5/m"), cfg)).admitted
        redis_client.script_flush()
        assert (await admission.acheck(_gate("5/m"), cfg)).admitted

    run(main())
    assert redis_client.get(KEYS.admission_all) == b"2"


def test_a_late_reply_after_a_timeout_is_not_given_to_the_next_caller(tmp_path):
    with redis_server(tmp_path / "r") as server:
        cfg = Config(redis_url=server.url, redis_socket_timeout_s=0.3)

        async def main() -> None:
            assert (await admission.acheck(_gate("5/m"), cfg)).admitted
            os.kill(server.pid, signal.SIGSTOP)  # Redis stops answering, socket stays open
            try:
                with pytest.raises(redis.exceptions.TimeoutError):
                    await admission.acheck(_gate("5/m"), cfg)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            # The timed-out call's reply arrives now; it must not answer this call.
            other = admission.Limit(KEYS.admission_task("t"), Rate.parse("1/m"))
            assert (await admission.acheck((other,), cfg)).admitted
            assert not (await admission.acheck((other,), cfg)).admitted

        run(main())
        # The timed-out check did run: its unit was counted (the documented direction).
        assert server.client().get(KEYS.admission_all) == b"2"


def test_a_restart_fails_the_call_in_flight_and_the_next_one_reconnects(tmp_path):
    with redis_server(tmp_path / "r") as server:
        cfg = Config(redis_url=server.url)

        async def main() -> None:
            assert (await admission.acheck(_gate("5/m"), cfg)).admitted
            before = await pipelined.for_loop(cfg)
            server.restart()
            with pytest.raises(redis.exceptions.ConnectionError):
                for _ in range(50):  # until the loop has seen the socket close
                    await admission.acheck(_gate("5/m"), cfg)
                    await asyncio.sleep(0.01)
            assert (await admission.acheck(_gate("5/m"), cfg)).admitted
            assert await pipelined.for_loop(cfg) is not before

        run(main())


def test_auth_with_user_and_password_and_db_from_the_url(tmp_path):
    with redis_server(tmp_path / "r") as server:
        admin = server.client()
        admin.acl_setuser(
            "app", enabled=True, passwords=["+s3cret"], keys=["*"], categories=["+@all"]
        )
        admin.config_set("requirepass", "topsecret")
        try:
            port = server.port
            for url in (
                f"redis://app:s3cret@127.0.0.1:{port}/3",
                f"redis://:topsecret@127.0.0.1:{port}/3",
            ):
                cfg = Config(redis_url=url)
                assert run(admission.acheck(_gate("5/m"), cfg)).admitted
            bad = Config(redis_url=f"redis://:wrong@127.0.0.1:{port}/0")
            with pytest.raises(redis.exceptions.ResponseError, match="WRONGPASS"):
                run(admission.acheck(_gate("5/m"), bad))
            checker = server.client(password="topsecret", db=3)
            assert checker.get(KEYS.admission_all) == b"2"  # both in db 3
        finally:
            server.client(password="topsecret").config_set("requirepass", "")


def test_event_loops_never_share_a_connection(redis_server, redis_client):
    cfg = Config(redis_url=redis_server.url)

    both_connected = threading.Barrier(2)

    async def client_id() -> int:
        conn = await pipelined.for_loop(cfg)
        await asyncio.to_thread(both_connected.wait, 10)  # both loops alive at once
        assert await pipelined.for_loop(cfg) is conn  # cached within its loop
        return int(await conn.call(pipelined.pack("CLIENT", "ID")))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ids = list(pool.map(lambda _: run(client_id()), range(2)))
    assert ids[0] != ids[1]


def test_a_loop_closed_without_close_loop_is_forgotten(redis_server, redis_client):
    cfg = Config(redis_url=redis_server.url)

    async def connect() -> asyncio.AbstractEventLoop:
        await pipelined.for_loop(cfg)
        return asyncio.get_running_loop()

    abandoned = asyncio.run(connect())  # asyncio.run closes the loop, not the connection
    assert abandoned.is_closed() and abandoned in pipelined._per_loop
    gone = weakref.ref(abandoned)
    del abandoned
    # The next loop drops it, and with it the last reference to the abandoned socket,
    # which Python then reports as never closed (it was not: nobody called close_loop).
    with pytest.warns(ResourceWarning, match="unclosed transport"):
        run(connect())
        gc.collect()
    assert gone() is None  # the closed loop itself is freed
