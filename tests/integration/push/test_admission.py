"""G6: admission control on push. Refused pushes store, send and count nothing; the
limit holds exactly under concurrent callers; duplicates, retries, resurrections and
releases are not counted. Real Redis; a real worker only where a task has to run
(elsewhere accepted messages wait in the broker's list)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from relier_django import AdmissionRejected, TaskFailed, rl_task
from relier_django.core.model import config
from relier_django.core.model.config import Config
from relier_django.core.model.errors import ConfigError
from relier_django.core.model.rates import Rate
from relier_django.core.push import admission
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks

KEYS = KeySpace("rl")


@pytest.fixture
def limits(settings, redis_client):
    """Set admission settings for one test (setting_changed drops the cached config)."""

    def apply(**relier: object) -> None:
        settings.RELIER = {**settings.RELIER, **relier}

    return apply


def stored_tasks() -> int:
    return sum(1 for _ in sync_client(config.current()).scan_iter(match=KEYS.task("*")))


def queued(queue: str = "celery") -> int:
    return int(sync_client(config.current()).llen(queue))


def test_over_the_global_limit_a_push_is_refused_with_retry_after_and_nothing_stored(limits):
    limits(ADMISSION_LIMIT="5/m")
    for i in range(5):
        tasks.record.push(f"a{i}")
    with pytest.raises(AdmissionRejected) as refused:
        tasks.sync_record.push("one too many")
    assert refused.value.task == tasks.sync_record.name
    assert 0 < refused.value.retry_after_s <= 60
    assert stored_tasks() == 5 and queued() == 5
    assert int(sync_client(config.current()).get(KEYS.admission_all)) == 5  # not counted


def test_a_tasks_own_rate_limit_counts_only_its_pushes(limits):
    for i in range(3):
        tasks.limited.push(f"l{i}")
    with pytest.raises(AdmissionRejected, match=r"demo\.limited: too many pushes"):
        tasks.limited.push("l3")
    tasks.record.push("other task")  # not limited
    assert stored_tasks() == 4


def test_a_per_task_setting_wins_over_the_decorator(limits):
    limits(ADMISSION_TASK_LIMITS={"demo.limited": "1/m"})
    tasks.limited.push("s0")
    with pytest.raises(AdmissionRejected):
        tasks.limited.push("s1")


def test_idempotent_duplicates_are_not_counted(limits):
    limits(ADMISSION_TASK_LIMITS={"demo.charge": "2/m"})
    first = tasks.charge.push("order-1", 10)
    for _ in range(5):
        assert tasks.charge.push("order-1", 10).task_id == first.task_id
    tasks.charge.push("order-2", 10)
    with pytest.raises(AdmissionRejected):
        tasks.charge.push("order-3", 10)


def test_apush_is_admitted_and_refused_the_same_way(limits):
    limits(ADMISSION_LIMIT="2/m")

    async def main() -> None:
        await tasks.record.apush("x1")
        await tasks.record.apush("x2")
        with pytest.raises(AdmissionRejected):
            await tasks.record.apush("x3")

    asyncio.run(main())
    assert stored_tasks() == 2


def test_the_limit_holds_exactly_under_concurrent_pushes(limits):
    limits(ADMISSION_LIMIT="50/m")
    admitted, refused = [], []
    lock = threading.Lock()

    def pusher(n: int) -> None:
        for i in range(10):
            try:
                receipt = tasks.record.push(f"c{n}-{i}")
            except AdmissionRejected:
                with lock:
                    refused.append(1)
            else:
                with lock:
                    admitted.append(receipt.task_id)

    threads = [threading.Thread(target=pusher, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 50 and len(refused) == 110
    assert stored_tasks() == 50 and queued() == 50


def test_the_standalone_check_admits_counts_and_refuses(redis_client):
    client = sync_client(config.current())
    found = admission.limits(KEYS, Config(admission_limit="2/s"), "t.any", Rate.parse("1/m"))
    assert [f.key for f in found] == [KEYS.admission_all, KEYS.admission_task("t.any")]
    assert admission.check(found).run(client).admitted
    second = admission.check(found).run(client)  # the task's 1/m is full
    assert not second.admitted and 0 < second.retry_after_s <= 60
    assert client.get(KEYS.admission_all) == "1"  # a refusal counts on no counter


def test_malformed_limits_are_configuration_errors():
    with pytest.raises(ConfigError, match="admission_limit"):
        Config(admission_limit="lots")
    with pytest.raises(ConfigError, match=r"is not 'task\.name=RATE'"):
        Config(admission_task_limits=("shop.charge 100/s",))
    with pytest.raises(ValueError, match='a rate looks like "5/m"'):
        rl_task(name="t.bad_rate", admission_limit="fast")


def test_a_replayed_push_is_not_counted_twice(limits):
    """A client retry after a lost reply re-runs push.lua with the same envelope."""
    from relier_django.core.push import idempotency, producer

    limits(ADMISSION_LIMIT="5/m")
    cfg = config.current()
    env = producer.prepare(tasks.record.relier_spec, ("replayed",), {})
    gates = admission.limits(KEYS, cfg, tasks.record.name, None)
    client = sync_client(cfg)
    for _ in range(3):
        assert idempotency.store(KEYS, env, env.encode(), 60_000, 3, gates).run(client).stored
    assert client.get(KEYS.admission_all) == "1"


def test_retries_resurrections_and_releases_are_not_counted(limits, worker_factory):
    """Only a push is new work. The worker runs with the same limit, so a retry,
    resurrection or release that counted would fill it before the last push."""
    from relier_django.core.dlq.release import release
    from testproject.celery import app

    limits(ADMISSION_LIMIT="4/h")  # an hour: the window cannot reset mid-test
    worker_factory(extra_env={"RELIER_ADMISSION_LIMIT": "4/h"})
    client = sync_client(config.current())

    def counted() -> int:
        return int(client.get(KEYS.admission_all))

    assert tasks.flaky.push("retried", 2).get(timeout=30)["attempt"] == 3  # two retries
    assert counted() == 1

    poison = tasks.self_destruct.push("resurrected")  # dies on every run
    with pytest.raises(TaskFailed) as err:
        poison.get(timeout=60)
    assert err.value.reason == "resurrection_limit"
    assert client.llen("demo:exec:resurrected") == 3  # first run + two resurrections
    assert counted() == 2

    broken = tasks.explode.push("released")
    with pytest.raises(TaskFailed):
        broken.get(timeout=30)
    for _ in range(2):  # released twice; each run lands in the DLQ again
        with pytest.raises(TaskFailed):
            release(app, config.current(), broken.task_id).get(timeout=30)
    assert client.llen("demo:exec:released") == 3
    assert counted() == 3

    tasks.record.push("fourth")  # the limit is still live: one more fits, then none
    with pytest.raises(AdmissionRejected):
        tasks.record.push("fifth")
    assert counted() == 4


def test_the_public_check_counts_a_tasks_units_as_its_pushes_would(redis_client):
    """``relier_django.admission``: the standalone check by task name, sync and async,
    on the limits a push of that task meets (here its own ``admission_limit``, 3/m); a
    task with no limit is admitted without a round trip."""
    from relier_django import admission as public

    got = [public.check("demo.limited") for _ in range(3)]
    assert [v.admitted for v in got] == [True, True, True]
    refused = asyncio.run(public.acheck("demo.limited"))
    assert not refused.admitted and 0 < refused.retry_after_s <= 60
    with pytest.raises(AdmissionRejected):  # the same counter a push meets
        tasks.limited.push("after-the-check")
    assert public.check("demo.record").admitted  # no limit on it
    assert public.check("no.such.task").admitted  # nor on a name no task has


def test_the_public_events_are_the_cores(redis_client):
    """``relier_django.events`` offers the core's events to plain functions."""
    from relier_django import events
    from relier_django.core.model import events as core_events

    seen: list[object] = []
    events.subscribe(seen.append)
    try:
        core_events.emit(events.TaskCancelled("t1", False, "demo.record", "celery"))
    finally:
        assert events.unsubscribe(seen.append)
    assert seen == [events.TaskCancelled("t1", False, "demo.record", "celery")]
