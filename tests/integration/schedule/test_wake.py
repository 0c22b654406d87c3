"""The scanner leader keeps the earliest due time it last read and reads it again only
when woken or after it dispatched (schedule/dispatch.py, issue 37): a push that makes a
new earliest due time rings ``<p>:sched:wake``, one that does not make one does not (a
ring costs the leader a read), and what the leader's own dispatch puts back (a rate's
later turn) it reads again itself. On a real Redis, with the leader's own Dispatcher."""

from __future__ import annotations

from relier_django.core.model import config
from relier_django.core.schedule.dispatch import Dispatcher
from testproject.celery import app
from testproject.demo import limit_tasks, tasks

WAKE = "rl:sched:wake"


def test_a_countdown_that_comes_first_rings_and_one_that_comes_later_does_not(redis_client):
    tasks.noop.push_with(countdown=60).push()
    assert redis_client.lpop(WAKE) is not None  # the leader's wait would end
    tasks.noop.push_with(countdown=120).push()
    assert redis_client.llen(WAKE) == 0
    tasks.noop.push_with(countdown=30).push()
    assert redis_client.llen(WAKE) == 1


def test_a_task_its_rate_holds_back_is_seen_by_the_leader_that_held_it_back(redis_client):
    # demo.lim.rated: 20/s with a burst of 20. The gate is passed at dispatch
    # (schedule_take.lua, run by the leader): the 21st goes back into the schedule for
    # its turn, 50 ms on, with no ring, and the leader, having dispatched, reads the
    # earliest due time again.
    dispatcher = Dispatcher(app, config.current(), "scanner:wake@host")
    for i in range(21):
        limit_tasks.rated.push("w", f"r{i}")
    redis_client.delete(WAKE)
    assert dispatcher.next_due_in_s() == 0.0
    assert dispatcher.run_due() == 20
    assert redis_client.zcard("rl:sched") == 1 and redis_client.llen(WAKE) == 0
    due_in = dispatcher.next_due_in_s()
    assert due_in is not None and 0 < due_in <= 0.1


def _zranges(client) -> int:  # type: ignore[no-untyped-def]
    return int(client.info("commandstats").get("cmdstat_zrange", {}).get("calls", 0))


def test_the_leader_reads_the_earliest_due_time_only_after_a_ring_or_a_dispatch(redis_client):
    dispatcher = Dispatcher(app, config.current(), "scanner:wake@host")
    assert dispatcher.next_due_in_s() is None
    tasks.noop.push_with(countdown=60).push()
    assert dispatcher.next_due_in_s() is None  # the ring is not waited on yet
    dispatcher.wait(1.0)  # returns at once: rung
    due_in = dispatcher.next_due_in_s()
    assert due_in is not None and 59 < due_in <= 60.1
    reads = _zranges(redis_client)
    for _ in range(3):
        dispatcher.wait(0.1)  # nothing rings
        assert dispatcher.next_due_in_s() is not None
    assert _zranges(redis_client) == reads  # not read again
