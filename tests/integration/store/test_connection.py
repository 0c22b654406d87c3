"""Where relier's Redis clients connect, and how (core/connection.py): passwords, TLS,
Sentinel discovery, fork and event-loop safety, and URLs that never show a password
in a log, an error or a page. Every server here is private, started and stopped by
PID; the Sentinel *failover* is in tests/chaos/test_sentinel.py. (G8, G1)"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from relier_django import conf
from relier_django.core.model.config import Config
from relier_django.core.model.errors import ConfigError
from relier_django.core.store import connection
from relier_django.core.store.connection import async_client, redact, sync_client
from relier_django.core.store.scripts import LuaScript
from testproject.demo import tasks
from testproject.harness import (
    REPO_ROOT,
    CeleryWorker,
    RedisServer,
    SentinelServer,
    make_tls_files,
    process_pointed_at,
    wait_until,
    worker_env,
)

# Characters that must be percent-encoded in a URL: the password has to survive the
# round trip through quoting, and must not appear in any form.
PASSWORD = "pa:ss/w@rd#1"
ENCODED = "pa%3Ass%2Fw%40rd%231"


def secrets_in(text: str) -> list[str]:
    return [s for s in (PASSWORD, ENCODED, "w@rd", "rd#1") if s in text]


# --- configuration ------------------------------------------------------------------


def test_sentinels_without_a_master_name_or_a_master_name_alone_are_refused():
    with pytest.raises(ConfigError, match="sentinel_master is not"):
        Config(sentinels=("127.0.0.1:26379",))
    with pytest.raises(ConfigError, match="sentinels is empty"):
        Config(sentinel_master="mymaster")
    with pytest.raises(ConfigError, match="unix:// redis_url cannot be combined"):
        Config(redis_url="unix:///tmp/r.sock", sentinels=("h:1",), sentinel_master="m")


@pytest.mark.parametrize("entry", ["10.0.0.5", "10.0.0.5:", ":26379", "h:port", "h:70000"])
def test_a_sentinel_that_is_not_host_colon_port_is_refused_naming_it(entry):
    with pytest.raises(ConfigError, match=f"sentinels: {entry!r} is not 'host:port'"):
        Config(sentinels=(entry,), sentinel_master="m")


def test_sentinels_come_from_the_environment_comma_separated(settings, monkeypatch):
    settings.RELIER = {}
    monkeypatch.setenv("RELIER_SENTINELS", "10.0.0.5:26379, [::1]:26380")
    monkeypatch.setenv("RELIER_SENTINEL_MASTER", "mymaster")
    monkeypatch.setenv("RELIER_SENTINEL_PASSWORD", "sentinel-secret")
    conf.get_config.cache_clear()
    try:
        cfg = conf.get_config()
        assert cfg.sentinel_addresses() == (("10.0.0.5", 26379), ("::1", 26380))
        assert cfg.sentinel_master == "mymaster"
        assert "sentinel-secret" not in repr(cfg)
        monkeypatch.delenv("RELIER_SENTINEL_MASTER")
        conf.get_config.cache_clear()
        with pytest.raises(ImproperlyConfigured, match="sentinel_master is not"):
            conf.get_config()
    finally:
        monkeypatch.undo()
        conf.get_config.cache_clear()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (f"redis://:{ENCODED}@10.0.0.5:6379/2", "redis://:***@10.0.0.5:6379/2"),
        (f"rediss://app:{ENCODED}@[::1]:6380/0", "rediss://app:***@[::1]:6380/0"),
        (f"redis://host/0?password={ENCODED}&db=1", "redis://host/0?password=%2A%2A%2A&db=1"),
        (f"redis://:{ENCODED}@host:notaport/0", "redis://***@host:notaport/0"),
    ],
)
def test_redact_hides_the_password_in_every_form_a_url_can_carry_it(url, shown):
    assert redact(url) == shown
    assert not secrets_in(redact(url))
    # A config is printed by tracebacks with locals and by error trackers.
    assert not secrets_in(repr(Config(redis_url=url)))


# --- passwords ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def password_server(tmp_path_factory):
    server = RedisServer(directory=tmp_path_factory.mktemp("redis-pw"), password=PASSWORD)
    server.start()
    yield server
    server.stop()


def _async_roundtrip(cfg: Config) -> str:
    async def main() -> str:
        try:
            client = async_client(cfg)
            await client.set("async-key", "async-value")
            return await client.get("async-key")
        finally:
            await connection.close_loop_clients()

    return asyncio.run(main())


_GET = LuaScript("get", "return redis.call('GET', KEYS[1])")


def _through_the_lane(cfg: Config) -> str:
    """``sync-key`` read by a script through the sync client's fast lane."""
    client = sync_client(cfg)
    assert connection.fast_lane(client) is not None
    return _GET.run(client, ["sync-key"], [])


def test_a_password_url_authenticates_the_sync_and_async_clients(password_server):
    assert "%40" in password_server.url  # the '@' in the password is percent-encoded
    cfg = Config(redis_url=password_server.url)
    sync_client(cfg).set("sync-key", "sync-value")
    assert sync_client(cfg).get("sync-key") == "sync-value"
    assert _through_the_lane(cfg) == "sync-value"
    assert _async_roundtrip(cfg) == "async-value"
    assert not secrets_in(connection.describe(cfg))


def test_a_wrong_password_is_an_error_that_shows_neither_password(password_server):
    wrong = Config(redis_url=password_server.url.replace(ENCODED, "not-" + ENCODED))
    with pytest.raises(redis.exceptions.AuthenticationError) as err:
        sync_client(wrong, fail_fast=True).ping()
    shown = "".join(traceback.format_exception(err.value)) + repr(sync_client(wrong))
    assert not secrets_in(shown), shown


def _connections(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_connections_received"])


def test_a_wrong_password_is_refused_at_the_first_attempt_not_retried(password_server):
    # A rejected password cannot change within a retry budget: each client that would
    # retry a dropped connection (ten times, with backoff) tries a refused AUTH once.
    wrong = Config(redis_url=password_server.url.replace(ENCODED, "not-" + ENCODED))

    async def async_ping() -> None:
        try:
            await async_client(wrong).ping()
        finally:
            await connection.close_loop_clients()

    def subscribe() -> None:
        connection.named_client(wrong, "relier-liveness-test").pubsub().subscribe("c")

    for name, call in (
        ("sync", lambda: sync_client(wrong).ping()),
        ("async", lambda: asyncio.run(async_ping())),
        ("subscription", subscribe),
    ):
        before = _connections(password_server)
        with pytest.raises(redis.exceptions.AuthenticationError):
            call()
        # One refused connection (plus this test's own for the count).
        assert _connections(password_server) - before == 2, name


# --- TLS ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, tls_files):
    server = RedisServer(directory=tmp_path_factory.mktemp("redis-tls"), tls=tls_files)
    server.start()
    yield server
    server.stop()


def test_rediss_verifies_the_server_against_the_ca_from_the_url(tls_server):
    cfg = Config(redis_url=tls_server.url)  # rediss://127.0.0.1:port/0?ssl_ca_certs=ca.crt
    assert cfg.redis_url.startswith("rediss://") and "ssl_ca_certs=" in cfg.redis_url
    sync_client(cfg).set("sync-key", "sync-value")
    assert sync_client(cfg).get("sync-key") == "sync-value"
    assert _through_the_lane(cfg) == "sync-value"
    assert _async_roundtrip(cfg) == "async-value"
    with tls_server.client() as direct:
        assert direct.config_get("port") == {"port": "0"}  # no plain-text port at all


def test_rediss_without_the_ca_refuses_a_self_signed_server(tls_server):
    cfg = Config(redis_url=f"rediss://127.0.0.1:{tls_server.port}/0")
    with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        sync_client(cfg, fail_fast=True).ping()


def test_client_certificates_from_the_url_pass_mutual_tls(tmp_path, tls_files):
    server = RedisServer(
        directory=tmp_path, tls=tls_files, extra_args=("--tls-auth-clients", "yes")
    )
    server.start()
    try:
        without = Config(redis_url=server.url)
        with pytest.raises(redis.exceptions.ConnectionError):
            sync_client(without, fail_fast=True).ping()
        with_cert = Config(
            redis_url=f"{server.url}&ssl_certfile={tls_files.client_cert}"
            f"&ssl_keyfile={tls_files.client_key}"
        )
        assert sync_client(with_cert).ping()
        assert _async_roundtrip(with_cert) == "async-value"
    finally:
        server.stop()


# --- Sentinel discovery (one sentinel, no failover: see tests/chaos/test_sentinel.py) --


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A password-protected master watched by one sentinel with a password of its own."""
    base = tmp_path_factory.mktemp("sentinel")
    master = RedisServer(directory=base / "master", password="master-pass")
    sentinel = SentinelServer(
        directory=base / "sentinel",
        master_name="watched",
        master_port=master.port,
        quorum=1,
        password="sentinel-pass",
        master_password="master-pass",
    )
    try:
        master.start()
        sentinel.start()
        yield master, sentinel
    finally:
        sentinel.stop()
        master.stop()


def _via_sentinel(sentinel: SentinelServer, sentinel_password: str | None) -> Config:
    # The URL's host and port are ignored under Sentinel; its password and db are used.
    return Config(
        redis_url="redis://:master-pass@no-such-host.invalid:1/3",
        sentinels=(sentinel.address,),
        sentinel_master="watched",
        sentinel_password=sentinel_password,
    )


def test_sentinel_discovery_applies_the_urls_password_and_db(watched):
    master, sentinel = watched
    cfg = _via_sentinel(sentinel, "sentinel-pass")
    sync_client(cfg).set("via-sentinel", "sync")
    assert _async_roundtrip(cfg) == "async-value"
    with master.client(db=3, decode_responses=True) as direct:
        assert direct.get("via-sentinel") == "sync" and direct.get("async-key") == "async-value"
    options = asyncio.run(connection.connection_options(cfg))
    assert (options["host"], options["port"], options["db"]) == ("127.0.0.1", master.port, 3)
    shown = connection.describe(cfg)
    assert shown == (
        f"master 'watched' via sentinels {sentinel.address} (redis://:***@no-such-host.invalid:1/3)"
    )


def test_rediss_makes_the_sentinel_and_the_master_connections_tls(tmp_path, tls_files):
    master = RedisServer(directory=tmp_path / "master", tls=tls_files)
    sentinel = SentinelServer(
        directory=tmp_path / "sentinel",
        master_name="tls-watched",
        master_port=master.port,
        quorum=1,
        tls=tls_files,
    )
    try:
        master.start()
        sentinel.start()
        cfg = Config(
            redis_url=f"rediss://ignored.invalid/2?ssl_ca_certs={tls_files.ca}",
            sentinels=(sentinel.address,),
            sentinel_master="tls-watched",
        )
        sync_client(cfg).set("via-tls-sentinel", "sync")
        assert _async_roundtrip(cfg) == "async-value"
        with master.client(db=2, decode_responses=True) as direct:
            assert direct.get("via-tls-sentinel") == "sync"
        # Neither listens in plain text: a TLS-less client cannot even ask the sentinel.
        plain = Config(
            redis_url="redis://ignored.invalid/2",
            sentinels=(sentinel.address,),
            sentinel_master="tls-watched",
        )
        with pytest.raises(redis.exceptions.ConnectionError):
            sync_client(plain, fail_fast=True).ping()
    finally:
        sentinel.stop()
        master.stop()


def test_the_pipelined_admission_check_finds_the_master_through_sentinel(watched):
    from relier_django.core.model.rates import Rate
    from relier_django.core.push import admission

    master, sentinel = watched
    cfg = _via_sentinel(sentinel, "sentinel-pass")
    gate = (admission.Limit("rl:test:pipelined-gate", Rate.parse("5/m")),)

    async def main() -> bool:
        try:
            return (await admission.acheck(gate, cfg)).admitted
        finally:
            await connection.close_loop_clients()  # closes the pipelined connection too

    assert asyncio.run(main())
    with master.client(db=3, decode_responses=True) as direct:
        assert direct.get("rl:test:pipelined-gate") == "1"


def test_a_wrong_sentinel_password_is_an_error_that_shows_no_password(watched):
    _, sentinel = watched
    cfg = _via_sentinel(sentinel, "wrong-sentinel-pass")
    with pytest.raises(redis.exceptions.ConnectionError, match="No master found") as err:
        sync_client(cfg, fail_fast=True).ping()
    shown = "".join(traceback.format_exception(err.value))
    assert not any(s in shown for s in ("master-pass", "sentinel-pass")), shown


# --- fork safety --------------------------------------------------------------------


def _in_child(work) -> dict:
    """Run ``work()`` in a forked child; return the JSON it produced."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 0
        try:
            os.close(read)
            os.write(write, json.dumps(work()).encode())
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed (see stderr)"
    return json.loads(data)


def _info(client: redis.Redis) -> dict:
    info = client.client_info()
    return {"id": int(info["id"]), "addr": info["addr"], "name": info["name"]}


async def _async_id(cfg: Config) -> int:
    return int((await async_client(cfg).client_info())["id"])


def test_a_forked_child_opens_its_own_connections_and_the_parents_keep_working(
    redis_server, redis_client
):
    cfg = Config(redis_url=redis_server.url)
    parent_client = sync_client(cfg)
    parent = _info(parent_client)
    loop = asyncio.new_event_loop()
    try:
        parent_async = loop.run_until_complete(_async_id(cfg))

        def child() -> dict:
            # The parent's client objects are still reachable in the child (a library
            # may hold one); relier's cache must not hand them out again.
            assert sync_client(cfg) is not parent_client
            return {"sync": _info(sync_client(cfg)), "async": asyncio.run(_async_id(cfg))}

        seen = _in_child(child)
        assert seen["sync"]["id"] != parent["id"] and seen["sync"]["addr"] != parent["addr"]
        assert seen["sync"]["name"] != parent["name"] == f"relier:{os.getpid()}"
        assert seen["async"] != parent_async
        # The parent's own connections were neither closed nor disturbed by the child.
        assert _info(sync_client(cfg)) == parent
        assert loop.run_until_complete(_async_id(cfg)) == parent_async
        loop.run_until_complete(connection.close_loop_clients())
    finally:
        loop.close()


def test_each_prefork_pool_process_uses_only_connections_it_opened(worker_factory, redis_server):
    # Children are recycled every 2 tasks, so most are forked from a main process that
    # already holds relier connections (its scanner and reservations use them).
    worker = worker_factory(concurrency=2, extra_args=("--max-tasks-per-child", "2"))
    receipts = [tasks.connection_info.push(0.2) for _ in range(10)]
    results = [r.get(timeout=60) for r in receipts]

    main_name = f"relier:{worker.pid}"
    with redis_server.client(decode_responses=True) as direct:
        main_ids = {int(c["id"]) for c in direct.client_list() if c["name"] == main_name}
    assert main_ids, "the worker's main process holds relier connections of its own"

    by_pid: dict[int, set[int]] = {}
    for result in results:
        for kind in ("sync", "async"):
            # Opened by this very process (CLIENT SETNAME runs when a socket connects).
            assert result[kind]["name"] == f"relier:{result['pid']}", result
            by_pid.setdefault(result["pid"], set()).add(result[kind]["id"])
    assert len(by_pid) >= 3, f"expected recycled children, saw {sorted(by_pid)}"
    assert worker.pid not in by_pid
    all_ids = [i for ids in by_pid.values() for i in ids]
    assert len(all_ids) == len(set(all_ids)), "two processes reported the same connection"
    assert not set(all_ids) & main_ids


# --- event loops --------------------------------------------------------------------


def test_loops_in_sequence_get_their_own_clients_and_a_closed_loop_is_forgotten(redis_server):
    cfg = Config(redis_url=redis_server.url)
    clients: list[redis.asyncio.Redis] = []

    async def ident() -> int:
        client = async_client(cfg)
        assert async_client(cfg) is client  # cached within one loop
        assert all(client is not earlier for earlier in clients)  # never a closed loop's
        clients.append(client)
        return int((await client.client_info())["id"])

    # asyncio.run closes each loop without closing its clients (no close_loop_clients).
    ids = [asyncio.run(ident()) for _ in range(3)]
    assert len(set(ids)) == 3  # another loop, another connection

    async def cached_loops() -> tuple[int, bool]:
        async_client(cfg)
        loops = list(connection._async)
        return sum(loop.is_closed() for loop in loops), asyncio.get_running_loop() in loops

    # A client's sockets refer to their loop, so a weak key alone would keep every
    # closed loop (and its sockets) for ever; a new loop's first call drops them. (A
    # loop still running elsewhere, relier's own event loop thread that an earlier test
    # started, keeps its entry.)
    gc.collect()
    assert asyncio.run(cached_loops()) == (0, True)


def test_loops_running_at_once_in_two_threads_never_share_a_connection(redis_server):
    cfg = Config(redis_url=redis_server.url)
    barrier = threading.Barrier(2)
    seen: dict[str, tuple[int, int]] = {}

    def thread(name: str) -> None:
        async def main() -> None:
            try:
                barrier.wait(10)  # both loops are alive at the same time
                client = async_client(cfg)
                info = await client.client_info()
                seen[name] = (id(client), int(info["id"]))
                await asyncio.sleep(0.2)
            finally:
                await connection.close_loop_clients()

        asyncio.run(main())

    threads = [threading.Thread(target=thread, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen["a"][0] != seen["b"][0] and seen["a"][1] != seen["b"][1]


# --- no password in logs, startup lines or error pages --------------------------------


def test_a_worker_on_a_password_url_never_logs_the_password(password_server, tmp_path):
    env = {"RELIER_REDIS_URL": password_server.url, "CELERY_BROKER_URL": password_server.url}
    worker = CeleryWorker(redis_url=password_server.url, log_dir=tmp_path, name="pw")
    try:
        worker.start()
        with process_pointed_at(env):
            assert tasks.record.push("pw-task", 0).get(timeout=60)["fence"] == 1
    finally:
        worker.stop()
    log = worker.log_text()
    assert f"relier's Redis: redis://:***@127.0.0.1:{password_server.port}/0" in log
    assert "committed task_id=" in log
    assert not secrets_in(log), secrets_in(log)


def test_a_worker_given_a_wrong_password_fails_without_showing_it(password_server, tmp_path):
    wrong = password_server.url.replace(ENCODED, "not-" + ENCODED)
    worker = CeleryWorker(redis_url=wrong, log_dir=tmp_path, name="wrong-pw")
    worker.start(wait=False)
    try:
        # It refuses to start, or keeps failing to connect: either way it says where.
        wait_until(
            lambda: not worker.alive() or "Cannot connect to" in worker.log_text(),
            30,
            what="the worker to report its failure",
        )
    finally:
        worker.stop()
    log = worker.log_text()
    assert ":***@127.0.0.1" in log or ":**@127.0.0.1" in log, log[-3000:]
    assert not secrets_in(log), log[-3000:]


def _resurrector(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "relier_resurrector", "--interval", "0.2"],
        cwd=REPO_ROOT,
        env=worker_env(url, {"TESTPROJECT_LOG_LEVEL": "INFO"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _output_until(proc: subprocess.Popen[str], *wanted: str, timeout_s: float = 30) -> str:
    """Everything ``proc`` printed until one of ``wanted`` appeared, then SIGTERM."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))
    reader.start()
    try:
        wait_until(lambda: any(w in "".join(lines) for w in wanted), timeout_s, what=str(wanted))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)
    return "".join(lines)


def test_the_resurrector_command_says_where_it_scans_without_the_password(password_server):
    out = _output_until(_resurrector(password_server.url), "scanning every")
    assert f"on redis://:***@127.0.0.1:{password_server.port}/0 scanning every" in out, out
    assert not secrets_in(out), out

    # A refused password is a configuration error: the command exits with it, naming the
    # server without the password, instead of scanning a Redis it cannot use.
    wrong = _resurrector(password_server.url.replace(ENCODED, "not-" + ENCODED))
    out, _ = wrong.communicate(timeout=60)
    assert wrong.returncode == 1, out
    assert f"Redis at redis://:***@127.0.0.1:{password_server.port}/0 refused" in out, out
    assert "invalid username-password" in out and not secrets_in(out), out


@pytest.mark.django_db
def test_the_admin_redis_down_page_and_the_dlq_command_hide_the_password(
    password_server, client, django_user_model, settings, monkeypatch
):
    from django.contrib.auth.models import Permission
    from django.core.management import CommandError, call_command
    from django.urls import reverse

    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_dlq"))
    client.force_login(user)
    wrong = password_server.url.replace(ENCODED, "not-" + ENCODED)
    monkeypatch.setenv("RELIER_REDIS_URL", wrong)
    conf.get_config.cache_clear()
    try:
        response = client.get(reverse("admin:relier_django_deadletter_changelist"))
        page = response.content.decode()
        assert response.status_code == 503
        assert f"redis://:***@127.0.0.1:{password_server.port}/0" in page
        assert not secrets_in(page)
        with pytest.raises(CommandError) as err:
            call_command("relier_dlq", "stats")
        assert "redis://:***@" in str(err.value) and not secrets_in(str(err.value))
    finally:
        monkeypatch.undo()
        conf.get_config.cache_clear()


def test_no_relier_module_builds_a_redis_client_outside_connection_py():
    # Every client goes through connection.py (and cluster.py, which it calls for a
    # Redis Cluster), so Sentinel, TLS, retries and fork safety hold everywhere.
    # (pipelined.py opens its own sockets, from the options
    # connection.connection_options() gives it.)
    package = Path(REPO_ROOT) / "relier_django"
    offenders = []
    for path in package.rglob("*.py"):
        if path.name in ("connection.py", "cluster.py"):
            continue
        text = path.read_text()
        if any(s in text for s in ("from_url(", "redis.Redis(", "Sentinel(", "StrictRedis(")):
            offenders.append(str(path.relative_to(package)))
    assert offenders == []


# --- the fast lane (scripts on hot paths) -----------------------------------------------


def test_a_script_whose_lane_connection_was_killed_runs_through_the_client(redis_server):
    cfg = Config(redis_url=redis_server.url)
    client = sync_client(cfg)
    client.set("sync-key", "v1")
    assert _through_the_lane(cfg) == "v1"
    with redis_server.client() as admin:
        # Every relier connection of this process, the lane's included, is cut.
        name = f"relier:{os.getpid()}"
        for entry in admin.client_list():
            if entry["name"] == name:
                admin.client_kill_filter(_id=entry["id"])
        admin.script_flush()  # and the scripts are gone too: EVAL on the way back
    client.set("sync-key", "v2")  # the client reconnects on its own (it retries)
    assert _GET.run(client, ["sync-key"], []) == "v2"  # the lane's send fails: the client's
    assert _GET.run(client, ["sync-key"], []) == "v2"  # the lane reconnected


def test_fail_fast_and_sentinel_clients_have_no_lane(redis_server):
    # A fail-fast client must not replay a script after a lost reply (ratelimit.lua
    # counts a hit once); a Sentinel master's address comes from its pool.
    assert (
        connection.fast_lane(sync_client(Config(redis_url=redis_server.url), fail_fast=True))
        is None
    )
    sentinel = Config(redis_url=redis_server.url, sentinels=("127.0.0.1:1",), sentinel_master="m")
    assert connection.fast_lane(sync_client(sentinel)) is None


def test_a_lane_makes_one_attempt_and_leaves_the_retries_to_the_client(tmp_path, monkeypatch):
    # A Redis that stops answering (SIGSTOP: it still accepts connections, as one behind
    # a network cut seems to). The lane's next call is due a health check; it must try
    # once. Its connections must not inherit the client's retry policy (ten retries of
    # timeouts), or such a Redis would cost the retry budget twice: the lane's, then
    # the client's.
    server = RedisServer(directory=tmp_path).start()
    try:
        cfg = Config(redis_url=server.url, redis_socket_timeout_s=0.2)
        lane = connection.fast_lane(sync_client(cfg))
        assert lane is not None and lane.call("PING") == "PONG"
        for idle in lane._idle:
            idle.next_health_check = 0  # idle past the health-check interval
        pings = []
        real = redis.connection.Connection._send_ping

        def counted(self):  # type: ignore[no-untyped-def]
            pings.append(1)
            return real(self)

        monkeypatch.setattr(redis.connection.Connection, "_send_ping", counted)
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
                lane.call("PING")
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert len(pings) == 1
    finally:
        server.stop()


def test_calls_ride_out_a_redis_restart_and_give_up_only_after_the_retry_budget(tmp_path):
    """operations.md: every relier call retries connection errors for at least 3.75 s.
    A Redis back within that time answers the calls made while it was down (sync, a
    script through the fast lane, async); one that stays down fails them, and not
    sooner. Only the floor is asserted: a slow machine can make a call later, never
    sooner."""
    server = RedisServer(directory=tmp_path).start()
    try:
        cfg = Config(redis_url=server.url)
        client = sync_client(cfg)
        client.set("sync-key", "before")
        assert _through_the_lane(cfg) == "before"

        def while_down(call):  # type: ignore[no-untyped-def]
            server.kill()
            back = threading.Timer(1.5, server.start)
            back.start()
            try:
                return call()
            finally:
                back.join()

        assert while_down(lambda: client.set("sync-key", "during")) is True
        assert while_down(lambda: _GET.run(client, ["sync-key"], [])) == "during"

        async def async_get() -> str:
            return await async_client(cfg).get("sync-key")

        assert while_down(lambda: asyncio.run(async_get())) == "during"

        server.kill()
        for call in (lambda: client.get("sync-key"), lambda: asyncio.run(async_get())):
            began = time.monotonic()
            with pytest.raises(redis.exceptions.ConnectionError):
                call()
            assert time.monotonic() - began >= 3.75
    finally:
        server.stop()
