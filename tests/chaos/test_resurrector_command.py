"""manage.py relier_resurrector: one pass, clean exit on signals, one leader at a time,
and a crashed leader replaced within the lease TTL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from testproject.demo import tasks
from testproject.harness import REPO_ROOT, wait_until, worker_env

KEYS = KeySpace("rl")
ENV = {
    "RELIER_LEADER_LEASE_S": "2",
    "RELIER_SCAN_INTERVAL_S": "0.2",
    "TESTPROJECT_LOG_LEVEL": "INFO",
}


def resurrector(redis_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "relier_resurrector", *args],
        cwd=REPO_ROOT,
        env=worker_env(redis_url, ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def expired_tasks(n: int) -> list[str]:
    client = sync_client(config.current())
    ids = []
    for i in range(n):
        env = producer.prepare(tasks.record.relier_spec, (f"cmd-{i}",), {})
        idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
        fencing.start(KEYS, env, "dead:1", 1).run(client)
        ids.append(env.id)
    time.sleep(0.01)
    return ids


def test_once_runs_one_pass_and_reports_it(redis_server, redis_client):
    ids = expired_tasks(3)
    proc = resurrector(redis_server.url, "--once")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "expired=3" in out and "resurrected=3" in out
    client = sync_client(config.current())
    assert all(client.hget(KEYS.task(i), "fence") == "2" for i in ids)
    assert client.get(KEYS.leader) is None  # released on exit


def test_sigterm_stops_it_cleanly_and_releases_the_lease(redis_server, redis_client):
    proc = resurrector(redis_server.url)
    client = sync_client(config.current())
    wait_until(lambda: client.get(KEYS.leader), 30, what="the leader lease")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "Resurrector stopped." in out
    assert client.get(KEYS.leader) is None


def test_one_leader_at_a_time_and_a_crashed_leader_is_replaced_within_the_lease(
    redis_server, redis_client
):
    client = sync_client(config.current())
    first = resurrector(redis_server.url)
    second = None
    try:
        leader = wait_until(lambda: client.get(KEYS.leader), 30, what="a leader")
        second = resurrector(redis_server.url)
        time.sleep(1.5)  # the second one is up and polling, but does not lead
        assert client.get(KEYS.leader) == leader
        first.kill()  # SIGKILL: no clean release
        killed_at = time.monotonic()
        new = wait_until(
            lambda: (v := client.get(KEYS.leader)) not in (None, leader) and v,
            10,
            what="a new leader",
        )
        assert time.monotonic() - killed_at < 2 + 1  # lease TTL + one interval, with slack
        assert new != leader
        ids = expired_tasks(2)  # and the new leader does the work
        wait_until(
            lambda: all(client.hget(KEYS.task(i), "fence") == "2" for i in ids), 10, what="passes"
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=30)
