"""G11 with real workers: a 1 s periodic entry fired by two scanners at once for about
ten seconds, one scanner SIGKILLed, then one worker SIGKILLed: every tick runs, each
one committed once, none missing.

The scanners are the two workers' embedded ones and two ``tests/periodic_runner.py``
processes (``fire_due`` in a loop on the Redis clock), all with the entry from the
environment (``DEMO_PERIODIC_EVERY_S``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from relier_django.core.model import config
from relier_django.core.schedule import periodic
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks  # noqa: F401 - registers the demo tasks
from testproject.harness import REPO_ROOT, wait_until, worker_env

KEYS = KeySpace("rl")
ENTRY = "demo-periodic"
ENV = {
    "DEMO_PERIODIC_EVERY_S": "1",
    "RELIER_RESURRECT_LEASE_S": "1",
    "RELIER_HEARTBEAT_TTL_S": "2",
    "RELIER_SCAN_INTERVAL_S": "0.5",
}


def _runner(redis_url: str, log) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.periodic_runner", "loop"],
        cwd=REPO_ROOT, env=worker_env(redis_url, ENV), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _now_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_two_scanners_fire_every_tick_once_through_a_scanner_and_a_worker_killed(
    redis_server, redis_client, worker_factory, tmp_path
):
    seed = _now_ms(redis_client)
    redis_client.hset(KEYS.periodic, ENTRY, seed)  # the first tick is the next second
    w1 = worker_factory(name="w1", extra_env=ENV)  # the ticks due meanwhile catch up
    w2 = worker_factory(name="w2", extra_env=ENV)
    logs = [open(tmp_path / f"runner{i}.log", "wb") for i in (1, 2)]  # noqa: SIM115
    runners = [_runner(redis_server.url, log) for log in logs]
    try:
        time.sleep(4)
        runners[0].send_signal(signal.SIGKILL)  # a scanner dies, mid-pass or between
        time.sleep(2)
        w1.kill()  # a worker dies, with whatever it had reserved or running
        time.sleep(4)
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.send_signal(signal.SIGKILL)
            runner.wait(10)
        for log in logs:
            log.close()
    # The workers' own scanners fire the entry too: stop the last one, so that no tick
    # is fired after the count below; a worker without the entry runs what is left.
    w2.terminate()
    worker_factory(name="w3", extra_env={k: v for k, v in ENV.items() if "PERIODIC" not in k})
    # The last scanner was SIGKILLed too, maybe holding a claim: one more scanner (this
    # process) takes it over once its lease ran out, and pushes that tick.
    time.sleep(1.2)
    before = app.conf.beat_schedule
    app.conf.beat_schedule = {ENTRY: {"task": "demo.sync_record", "schedule": 1.0,
                                      "args": ("periodic",)}}  # fmt: skip
    try:
        cfg = config.current().replace(resurrect_lease_s=1.0)
        periodic.fire_due(app, cfg, _now_ms(redis_client))
    finally:
        app.conf.beat_schedule = before
    assert not redis_client.hgetall(KEYS.periodic_claims)
    last = int(redis_client.hget(KEYS.periodic, ENTRY))
    ticks = list(range((seed // 1000 + 1) * 1000, last + 1, 1000))
    assert len(ticks) >= 10, f"only {len(ticks)} ticks in eleven seconds"

    def committed() -> bool:
        return all(redis_client.exists(KEYS.result(periodic.tick_id(ENTRY, t))) for t in ticks)

    wait_until(committed, 60, what="every tick's task committed (w1's resurrected)")
    runs = redis_client.lrange("demo:exec:periodic", 0, -1)
    # One run per tick; only a task running when its worker was SIGKILLed runs again,
    # under a new fence (G1), and one of its runs commits (G2).
    again = sum(1 for r in runs if not r.startswith(b"1:"))
    assert len(ticks) <= len(runs) <= len(ticks) + again
