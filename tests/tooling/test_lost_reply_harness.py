"""The lost-reply harness (testproject/lostreply.py) makes the fault it promises: Redis
runs a script, the reply never reaches the client, and relier's retrying clients run it
again. Replay tests of the scripts rest on it, so it is proven here first: the script
ran before the cut (the key moved twice), the client replayed it (two runs, one drop),
and unarmed the proxy changes nothing a client can see. (G8: a lost reply is retried)"""

from __future__ import annotations

import asyncio
import io
import socket
import threading

import pytest
import redis

from relier_django.core.store import connection
from relier_django.core.store.connection import async_client, sync_client
from relier_django.core.store.scripts import LuaScript, ScriptCall
from testproject.lostreply import (
    LostReplyProxy,
    RespStream,
    config_through,
    read_command,
    read_reply,
    script_sha,
)

# Test-only: a script whose every run is visible (the counter moves), unlike relier's,
# whose replays are no-ops by design.
INCR = LuaScript("test_incr", "return redis.call('INCR', KEYS[1])")


def incr(key: str = "counter") -> ScriptCall[int]:
    return ScriptCall(INCR, [key], [], int)


def counter(client: redis.Redis, key: str = "counter") -> int:
    return int(client.get(key) or 0)


# --- a lost reply is replayed ------------------------------------------------------------


def test_a_reply_lost_after_redis_ran_the_script_is_replayed_by_the_sync_client(
    lost_reply, redis_client
):
    lost_reply.drop_reply(INCR.sha)
    with config_through(lost_reply) as cfg:
        # The fast lane loses the reply; the client's retry runs the script again.
        assert connection.fast_lane(sync_client(cfg)) is not None
        assert incr().run(sync_client(cfg)) == 2  # the replay's reply
    assert counter(redis_client) == 2  # so the first run happened before the cut
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped, lost_reply.armed) == (2, 1, 0)


def test_a_reply_lost_after_redis_ran_the_script_is_replayed_by_the_async_client(
    lost_reply, redis_client
):
    async def main(cfg) -> int:
        try:
            return await incr().arun(async_client(cfg))
        finally:
            await connection.close_loop_clients()

    lost_reply.drop_reply(INCR.sha)
    with config_through(lost_reply) as cfg:
        assert asyncio.run(main(cfg)) == 2
    assert counter(redis_client) == 2
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped) == (2, 1)


def test_replies_lost_on_the_fast_lane_and_on_the_clients_first_attempt_are_retried(
    lost_reply, redis_client
):
    # The lane's call and the client's own first EVALSHA both lose their reply: only
    # the client's retry policy (not the lane's fallback) gets an answer.
    lost_reply.drop_reply(INCR.sha, nth=1)
    lost_reply.drop_reply(INCR.sha, nth=2)
    with config_through(lost_reply) as cfg:
        assert incr().run(sync_client(cfg)) == 3
    assert counter(redis_client) == 3
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped) == (3, 2)


def test_an_eval_after_script_flush_whose_reply_is_lost_is_replayed(lost_reply, redis_client):
    redis_client.script_flush()
    lost_reply.drop_reply(INCR.sha)
    with config_through(lost_reply) as cfg:
        # Lane: EVALSHA gets NOSCRIPT (not a run), EVAL runs and loses its reply; the
        # client's EVALSHA then finds the script the lost EVAL loaded.
        assert incr().run(sync_client(cfg)) == 2
    assert counter(redis_client) == 2
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped) == (2, 1)


def test_an_async_eval_after_script_flush_whose_reply_is_lost_is_replayed(lost_reply, redis_client):
    async def main(cfg) -> int:
        try:
            return await incr().arun(async_client(cfg))
        finally:
            await connection.close_loop_clients()

    redis_client.script_flush()
    lost_reply.drop_reply(INCR.sha)
    with config_through(lost_reply) as cfg:
        # EVALSHA: NOSCRIPT; EVAL loses its reply; the client's retry runs EVAL again.
        assert asyncio.run(main(cfg)) == 2
    assert counter(redis_client) == 2
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped) == (2, 1)


def test_a_fail_fast_client_gets_a_connection_error_and_the_script_ran_once(
    lost_reply, redis_client
):
    lost_reply.drop_reply(INCR.sha)
    with config_through(lost_reply) as cfg, pytest.raises(redis.exceptions.ConnectionError):
        incr().run(sync_client(cfg, fail_fast=True))
    assert counter(redis_client) == 1
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped) == (1, 1)


def test_the_cut_falls_right_after_the_script_commands_pipelined_behind_it_never_run(
    lost_reply, redis_client
):
    redis_client.script_load(INCR.source)
    lost_reply.drop_reply(INCR.sha)
    with socket.create_connection(("127.0.0.1", lost_reply.port)) as sock:
        sock.sendall(
            b"*4\r\n$7\r\nEVALSHA\r\n$40\r\n" + INCR.sha.encode() + b"\r\n$1\r\n1\r\n$1\r\nk\r\n"
            b"*2\r\n$4\r\nINCR\r\n$5\r\nlater\r\n"
        )
        assert sock.recv(1024) == b""  # closed, no reply
    assert (counter(redis_client, "k"), counter(redis_client, "later")) == (1, 0)


def test_an_arming_fires_on_the_nth_run_from_now_and_only_once(lost_reply, redis_client):
    lost_reply.drop_reply(INCR.sha, nth=3)
    with config_through(lost_reply) as cfg:
        client = sync_client(cfg)
        assert [incr().run(client) for _ in range(4)] == [1, 2, 4, 5]
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped, lost_reply.armed) == (5, 1, 0)


def test_an_arming_on_a_first_key_fires_only_on_a_run_with_that_key(lost_reply, redis_client):
    # Many callers run one script for many tasks: only the chosen key's run loses its reply.
    arming = lost_reply.drop_reply(INCR.sha, first_key="mine")
    with config_through(lost_reply) as cfg:
        client = sync_client(cfg)
        assert [incr("other").run(client) for _ in range(2)] == [1, 2]
        assert not arming.fired and lost_reply.armed == 1
        assert incr("mine").run(client) == 2  # the replay's reply
    assert arming.fired
    assert (counter(redis_client, "mine"), counter(redis_client, "other")) == (2, 2)
    assert (lost_reply.calls(INCR.sha), lost_reply.dropped, lost_reply.armed) == (4, 1, 0)


# --- unarmed, the proxy is transparent ----------------------------------------------------


def test_unarmed_pipelines_and_transactions_pass_through_and_scripts_are_counted(
    lost_reply, redis_client
):
    client = redis.Redis.from_url(lost_reply.url)
    try:
        for transaction in (False, True):
            pipe = client.pipeline(transaction=transaction)
            pipe.set("a", "1").incr("a").rpush("l", "x", "y").lrange("l", 0, -1)
            pipe.evalsha(INCR.sha, 1, "n") if transaction else pipe.eval(INCR.source, 1, "n")
            pipe.hset("h", mapping={"f": "v"}).hgetall("h")
            replies = pipe.execute()
            assert replies[:2] == [True, 2] and replies[-1] == {b"f": b"v"}
        assert counter(redis_client, "n") == 2
        assert (lost_reply.calls(INCR.sha), lost_reply.dropped) == (2, 0)
    finally:
        client.close()


def test_unarmed_a_value_of_several_megabytes_passes_intact(lost_reply):
    value = bytes(range(256)) * (5 * 4096)  # 5 MiB, every byte value, CRLFs included
    client = redis.Redis.from_url(lost_reply.url)
    try:
        client.set("big", value)
        assert client.get("big") == value
        assert client.mget("big", "missing", "big") == [value, None, value]
    finally:
        client.close()


# A Lua reply RESP3 clients get as a map holding an array, a double and a set.
NESTED = "return {map={a={1, {double=2.5}}, b={set={x=true}}}}"


def resp3_exchange(client: redis.Redis) -> list[object]:
    client.hset("h", mapping={"a": "1", "b": "2"})
    client.sadd("s", "x", "y")
    client.zadd("z", {"m": 1.5})
    return [
        client.execute_command("HELLO")["proto"],
        client.hgetall("h"),
        client.smembers("s"),
        client.zscore("z", "m"),
        client.execute_command("LOLWUT").splitlines()[-1],  # a verbatim string
        client.eval(NESTED, 0),
    ]


def test_unarmed_a_resp3_client_gets_maps_sets_doubles_and_verbatim_text(
    lost_reply, redis_server, redis_client
):
    direct = redis_server.client(protocol=3, decode_responses=True)
    client = redis.Redis.from_url(lost_reply.url, protocol=3, decode_responses=True)
    try:
        seen = resp3_exchange(client)
        assert seen == resp3_exchange(direct)
        assert seen[:4] == [3, {"a": "1", "b": "2"}, {"x", "y"}, 1.5]
        assert seen[5]["a"] == [1, 2.5]
    finally:
        client.close()
        direct.close()


def test_unarmed_many_connections_at_once_each_get_their_own_replies(lost_reply, redis_client):
    errors: list[BaseException] = []

    def work(n: int) -> None:
        client = redis.Redis.from_url(lost_reply.url)
        try:
            for i in range(50):
                client.set(f"k{n}", i)
                assert client.get(f"k{n}") == str(i).encode()
                client.incr("total")
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert counter(redis_client, "total") == 16 * 50


def test_an_inline_command_is_answered(lost_reply):
    with socket.create_connection(("127.0.0.1", lost_reply.port)) as sock:
        sock.sendall(b"\r\nPING\r\nECHO hi\n")
        stream = RespStream(sock.makefile("rb"))
        assert (read_reply(stream), read_reply(stream)) == (b"+PONG\r\n", b"$2\r\nhi\r\n")


def test_a_password_and_a_db_in_the_target_url_carry_over_to_the_proxys_url():
    proxy = LostReplyProxy("redis://:s3cret@127.0.0.1:6399/4")
    with proxy:
        assert proxy.url == f"redis://:s3cret@127.0.0.1:{proxy.port}/4"


def test_stop_closes_every_connection_and_joins_every_thread(redis_server):
    before = set(threading.enumerate())
    proxy = LostReplyProxy(redis_server.url).start()
    client = socket.create_connection(("127.0.0.1", proxy.port))
    client.sendall(b"PING\r\n")
    assert client.recv(64) == b"+PONG\r\n"
    proxy.stop()
    assert client.recv(64) == b""
    client.close()
    assert set(threading.enumerate()) <= before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


# --- the RESP parser, frame by frame -------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        b"+OK\r\n",
        b"-ERR no\r\n",
        b":-12\r\n",
        b"$-1\r\n",
        b"$0\r\n\r\n",
        b"$4\r\na\r\nb\r\n",
        b"*-1\r\n",
        b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
        b"_\r\n",
        b",3.25\r\n",
        b"#t\r\n",
        b"(3492890328409238509324850943850943825024385\r\n",
        b"!10\r\nSYNTAX err\r\n",
        b"=8\r\ntxt:abcd\r\n",
        b"%2\r\n+a\r\n:1\r\n+b\r\n~2\r\n:1\r\n,-inf\r\n",
        b">3\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n_\r\n",
        b"|1\r\n+ttl\r\n:3600\r\n*2\r\n:1\r\n:2\r\n",  # an attribute, then its reply
        b"$?\r\n;4\r\nHell\r\n;1\r\no\r\n;0\r\n",  # streamed string
        b"*?\r\n:1\r\n$1\r\nx\r\n.\r\n",  # streamed aggregate
    ],
)
def test_read_reply_reads_exactly_one_whole_frame_of_each_resp_type(frame):
    stream = RespStream(io.BytesIO(frame + b"+NEXT\r\n"))
    assert read_reply(stream) == frame
    assert read_reply(stream) == b"+NEXT\r\n"


def test_read_command_gives_the_raw_bytes_and_the_arguments():
    raw = b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n"
    assert read_command(RespStream(io.BytesIO(raw))) == (raw, [b"EVAL", b"return 1", b"0"])
    assert read_command(RespStream(io.BytesIO(b"get  k\r\n")))[1] == [b"get", b"k"]
    assert script_sha([b"eval_ro", b"return 1", b"0"]) == LuaScript("x", "return 1").sha
    assert script_sha([b"EVALSHA", INCR.sha.upper().encode(), b"1", b"k"]) == INCR.sha
    assert script_sha([b"GET", b"k"]) is None


def test_a_malformed_command_closes_its_connection_and_is_kept_for_the_test(redis_server):
    with LostReplyProxy(redis_server.url) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.sendall(b"*1\r\n:5\r\n")  # an argument that is not a bulk string
            assert sock.recv(64) == b""
        assert [str(e) for e in proxy.protocol_errors] == [
            "a command argument is not a bulk string: b':5\\r\\n'"
        ]
