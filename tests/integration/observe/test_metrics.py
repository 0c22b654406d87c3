"""The metrics: every figure against a workload whose truth is known.

Real workers on the private Redis run a workload of known shape (commits, retries, a
task that always raises, a cancel, a pool process that kills itself, a whole worker
SIGKILLed); the figures read back (``relier_django.metrics.read``, the endpoint's
Prometheus text, ``relier_status --json``) must equal what the workload did, and the
recovery latency must sit inside the bounds the test measured itself.
"""

from __future__ import annotations

import io
import json
import re
import time
from importlib import resources

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from relier_django import conf, metrics
from relier_django.core.model import config
from relier_django.core.observe import measurements
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.receipt import Receipt
from relier_django.core.worker import fencing
from testproject.demo import tasks
from testproject.harness import wait_until

pytestmark = pytest.mark.integration

KEYS = KeySpace("rl")
FAST = {
    "RELIER_HEARTBEAT_TTL_S": "1.5",
    "RELIER_SCAN_INTERVAL_S": "0.3",
    "RELIER_LEADER_LEASE_S": "2",
}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def _scrape(client, **headers) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    response = client.get("/relier/metrics", **headers)
    return response.status_code, response.content.decode()


def _done(receipts: list[Receipt]) -> bool:
    return all(r.status in ("SUCCESS", "FAILURE") for r in receipts)


def test_the_lua_and_python_histogram_bounds_agree():
    lua = resources.files("relier_django.core.store").joinpath("lua", "_metrics.lua").read_text()
    found = re.search(r"METRIC_BOUNDS_MS = \{([^}]*)\}", lua)
    assert found
    assert tuple(int(b) for b in found[1].replace("\n", " ").split(",")) == measurements.BOUNDS_MS


def test_a_known_workload_reads_back_exactly(fast_worker_factory, redis_client, settings):
    settings.RELIER = {**settings.RELIER, "METRICS_TOKEN": "s3cret"}
    # The default TTL: fragile's dead pool process is found by its main process's hand-off
    # (pool_death) or by its closed connection (process_death), whichever comes first,
    # never by a heartbeat that ran out (Celery may take seconds to see the death).
    fast_worker_factory(extra_env={"RELIER_HEARTBEAT_TTL_S": "10"})
    plain = [tasks.record.push(f"m-{i}") for i in range(5)]
    flaky = tasks.flaky.push("m-flaky", 2)  # two retries, then a commit
    explode = tasks.explode.push("m-explode")  # always raises: the DLQ, reason exception
    fragile = tasks.fragile.push("m-fragile", 1)  # its pool process dies once
    later = tasks.record.push_with(countdown=300).push("m-later")
    assert later.cancel()
    wait_until(lambda: _done([*plain, flaky, explode, fragile]), 60, what="workload done")

    found = metrics.read()
    assert dict(found.counters) == {
        "pushed": 9, "committed": 7, "retried": 2, "stale": 0, "released": 0,
        "cancelled": 1, "refused": 0,
    }  # fmt: skip
    assert dict(found.dead_lettered) == {"exception": 1}
    pool = "pool_death" if found.resurrections["pool_death"] else "process_death"
    assert found.resurrections == {**dict.fromkeys(found.resurrections, 0), pool: 1}
    assert found.recovery[pool].count == 1
    assert all(h.count == 1 for h in found.phases.values())
    # One observation per start: 5 records, 3 runs of flaky, 1 explode, 2 of fragile.
    assert found.queue_wait.count == 11
    assert found.live.by_state == dict.fromkeys(found.live.by_state, 0)
    assert found.dlq_entries == 1
    assert found.leader is not None
    assert len(found.live.workers) == 1
    one_hour = found.windows[0]
    assert (one_hour.name, one_hour.committed, one_hour.dead_lettered) == ("1h", 7, 1)
    assert one_hour.ratio == pytest.approx(7 / 8)
    assert one_hour.burn == pytest.approx((1 / 8) / (1 - 0.999))
    assert sum(m.committed for m in found.minutes) == 7
    assert sum(m.dead_lettered for m in found.minutes) == 1
    assert sum(m.recoveries for m in found.minutes) == 1

    status, text = _scrape(Client(), HTTP_AUTHORIZATION="Bearer s3cret")
    assert status == 200
    samples = _samples(text)
    assert samples[("relier_tasks_pushed_total", ())] == 9
    assert samples[("relier_tasks_committed_total", ())] == 7
    assert samples[("relier_tasks_retried_total", ())] == 2
    assert samples[("relier_tasks_cancelled_total", ())] == 1
    assert samples[("relier_tasks_dead_lettered_total", (("reason", "exception"),))] == 1
    assert samples[("relier_resurrections_total", (("cause", pool),))] == 1
    assert samples[("relier_recovery_seconds_count", (("cause", pool),))] == 1
    assert samples[("relier_queue_wait_seconds_count", ())] == 11
    assert samples[("relier_dlq_entries", ())] == 1
    assert samples[("relier_scanner_leader", ())] == 1
    assert samples[("relier_workers_alive", ())] == 1
    assert samples[("relier_slo_success_ratio", (("window", "1h"),))] == pytest.approx(7 / 8)

    out = io.StringIO()
    call_command("relier_status", "--json", stdout=out)
    as_json = json.loads(out.getvalue())
    assert as_json["counters"]["committed"] == 7
    assert as_json["dead_lettered"] == {"exception": 1}
    assert as_json["slo"]["windows"]["1h"]["dead_lettered"] == 1
    out = io.StringIO()
    call_command("relier_status", stdout=out)
    text = out.getvalue()
    assert "committed 7" in text and f"{pool} 1" in text and "DLQ: 1 entry" in text
    assert "1h: success 87.5000% (7 committed, 1 dead-lettered)" in text


def test_a_killed_worker_s_recovery_is_measured_within_the_bounds_seen(
    fast_worker_factory, redis_client
):
    client = sync_client(config.current())
    doomed = fast_worker_factory(name="doomed")
    receipt = tasks.work.push("m-kill", 3.0)
    wait_until(lambda: client.hget(KEYS.task(receipt.id), "state") == "running", 30)
    seconds, micros = client.time()
    killed_ms = seconds * 1000 + micros // 1000
    doomed.kill()  # SIGKILL to the whole worker: no hand-off, its heartbeat stops
    # The dead worker led the scanners. A survivor that started while its lease still
    # ran would find it dead by its connection first and hand its task off (cause
    # process_death, tests/chaos/test_process_death.py); this test is about the TTL.
    wait_until(lambda: client.get(KEYS.leader) is None, 30, what="the dead leader's lease")
    fast_worker_factory(name="survivor")
    wait_until(lambda: client.hget(KEYS.task(receipt.id), "fence") == "2"
               and client.hget(KEYS.task(receipt.id), "state") == "running", 30)  # fmt: skip
    restarted_ms = int(client.hget(KEYS.task(receipt.id), "started_ms"))
    wait_until(lambda: receipt.status == "SUCCESS", 30)

    found = metrics.read()
    assert found.resurrections["heartbeat"] == 1
    observed = found.recovery["heartbeat"]
    assert observed.count == 1
    # It is dated from the last heartbeat, which came at most one interval before the
    # kill (interval: TTL / 3 by default).
    interval_ms = 1500 / 3
    assert (
        restarted_ms - killed_ms
        <= observed.sum_s * 1000
        <= (restarted_ms - killed_ms + interval_ms + 50)
    )
    detection, redispatch, restart = (found.phases[p] for p in measurements.PHASES)
    assert detection.sum_s + redispatch.sum_s + restart.sum_s == pytest.approx(
        observed.sum_s, abs=0.003
    )
    assert detection.sum_s >= 1.5 - interval_ms / 1000  # waited for the TTL to run out


def test_gauges_show_the_store_as_it_is(fast_worker_factory, redis_client):
    waiting = [tasks.record.push(f"q-{i}") for i in range(3)]  # no worker runs yet
    later = [tasks.record.push_with(countdown=600).push(f"s-{i}") for i in range(2)]
    found = metrics.read()
    assert found.live.by_state == {
        "queued": 3, "reserved": 0, "running": 0, "scheduled": 2, "recovering": 0,
    }  # fmt: skip
    assert found.live.oldest_queued_s is not None and found.live.oldest_queued_s >= 0
    assert {t.task_id for t in found.live.tasks} == {r.id for r in waiting}
    assert found.leader is None and not found.live.workers
    assert [r.id for r in later]

    worker = fast_worker_factory()
    wait_until(lambda: len(metrics.read().live.workers) == 1, 10, what="worker announced")
    worker.terminate()  # a warm shutdown takes it off the list at once
    assert metrics.read().live.workers == ()


def test_metrics_off_counts_nothing(redis_client):
    off = KeySpace("rl", metrics=False)
    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("off",), {})
    assert idempotency.store(off, env, env.encode(), 60_000, 3).run(client)
    assert fencing.start(off, env, "w:1", 60_000).run(client).started
    assert fencing.commit(off, env, '{"ok": true}', 60_000).run(client).accepted
    assert not redis_client.exists("rl:m", "rl:m:w")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("token", "headers", "staff", "status"),
    [
        (None, {}, False, 403),
        (None, {}, True, 200),
        ("s3cret", {}, False, 403),
        ("s3cret", {"HTTP_AUTHORIZATION": "Bearer wrong"}, False, 403),
        ("s3cret", {"HTTP_AUTHORIZATION": "Bearer s3cret"}, False, 200),
        ("s3cret", {}, True, 200),
    ],
)
def test_who_may_read_the_endpoint(redis_client, settings, client, token, headers, staff, status):
    settings.RELIER = {**settings.RELIER, "METRICS_TOKEN": token}
    if staff:
        client.force_login(User.objects.create_user("ops", is_staff=True))
    got, text = _scrape(client, **headers)
    assert got == status
    if status == 200:
        assert "relier_tasks_pushed_total 0.0" in text
    else:
        assert "METRICS_TOKEN" in text


@pytest.mark.django_db
def test_a_redis_that_cannot_be_read_answers_503(settings, client, redis_down):
    settings.RELIER = {**settings.RELIER, "METRICS_TOKEN": "t"}
    conf.get_config.cache_clear()
    status, text = _scrape(client, HTTP_AUTHORIZATION="Bearer t")
    assert status == 503
    assert "relier's Redis cannot be read" in text


@pytest.fixture
def fast_worker_factory(worker_factory):
    def start(**kwargs):  # type: ignore[no-untyped-def]
        return worker_factory(extra_env={**FAST, **kwargs.pop("extra_env", {})}, **kwargs)

    return start


def test_a_window_slot_reused_for_a_new_minute_and_hour_starts_from_nothing(redis_client):
    # The rings hold 120 minutes and 80 hours: the slot a commit lands in now last held
    # the minute 120 ago and the hour 80 ago. Their counts must not carry over.
    client = sync_client(config.current())  # decodes replies, as the worker's does
    env = producer.prepare(tasks.record.relier_spec, ("w",), {}, "window-slot")
    seconds, _ = client.time()
    if seconds % 60 >= 58:  # start well inside a minute: the commit lands in the same one
        time.sleep(61 - seconds % 60)
        seconds, _ = client.time()
    minute, hour = seconds // 60, seconds // 3600
    m, h = f"m{minute % 120}", f"h{hour % 80}"
    client.hset("rl:m:w", mapping={
        m: minute - 120, f"{m}:ok": 50, f"{m}:dlq": 7, f"{m}:rec_n": 3, f"{m}:rec_ms": 900,
        f"{m}:rec_max": 400, h: hour - 80, f"{h}:ok": 900, f"{h}:dlq": 9,
    })  # fmt: skip
    assert idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client).stored
    assert fencing.start(KEYS, env, "w1@host:1", 30_000).run(client).started
    assert fencing.commit(KEYS, env, "{}", 60_000).run(client).accepted
    assert client.hgetall("rl:m:w") == {m: str(minute), f"{m}:ok": "1", h: str(hour),
                                              f"{h}:ok": "1"}  # fmt: skip
