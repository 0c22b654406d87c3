"""The fenced inbox (relier_django/db/inbox.py, docs/transactions.md): a unit of a task's
database work commits exactly once, whichever incarnations run it.

In process, with real commits (``django_db(transaction=True)``) on SQLite and on
PostgreSQL (alias ``pg``, the session's private server), and incarnations built by hand:
what tells two incarnations apart is their fence token, and what decides between them is
the database. tests/chaos/test_inbox_kill.py does the same with real workers and signals.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import IntegrityError, OperationalError, connections, transaction

from relier_django.core.model.errors import TaskLost
from relier_django.core.task import rl_task
from relier_django.core.worker.context import TaskContext
from relier_django.db.inbox import Unit, once, run_atomic
from relier_django.models import InboxEntry
from testproject.demo.models import Booking
from tests.databases import ALIASES, COMMITS, DATABASES, PG

TASK_ID = "0" * 31 + "1"


class Boom(Exception):
    """Raised inside a block to fail it."""


def incarnation(fence: int, task_id: str = TASK_ID) -> TaskContext:
    """The context of the task's incarnation holding ``fence``."""
    return TaskContext(task_id, fence, 1, fence - 1, "tests.inbox", f"host:{1000 + fence}")


def bookings(alias: str, label: str) -> list[int]:
    """Fences of the committed Booking rows of ``label`` (read in autocommit)."""
    return sorted(Booking.objects.using(alias).filter(label=label).values_list("fence", flat=True))


def entries(alias: str) -> dict[str, tuple[int, object]]:
    return {e.key: (e.fence, json.loads(e.result)) for e in InboxEntry.objects.using(alias).all()}


def book(alias: str, ctx: TaskContext, label: str, part: str = "") -> Unit:
    """One unit that writes one Booking row and records its fence."""
    with once(ctx, using=alias, part=part) as unit:
        if not unit.done:
            Booking.objects.using(alias).create(label=label, fence=ctx.fence_token)
            unit.result = {"label": label, "fence": ctx.fence_token}
    return unit


# --- one incarnation, then the next ---------------------------------------------------


@COMMITS
@ALIASES
def test_the_first_incarnation_commits_its_writes_and_its_inbox_row_together(alias):
    unit = book(alias, incarnation(1), "first")
    assert (unit.done, unit.fence, unit.result) == (True, 1, {"label": "first", "fence": 1})
    assert bookings(alias, "first") == [1]
    assert entries(alias) == {f"{TASK_ID}:": (1, {"label": "first", "fence": 1})}


@COMMITS
@ALIASES
def test_a_later_incarnation_finds_the_unit_done_and_takes_the_recorded_result(alias):
    book(alias, incarnation(1), "again")
    ran = []
    with once(incarnation(2), using=alias) as unit:
        assert unit.done  # known at enter: the block must not write again
        assert not connections[alias].in_atomic_block  # and nothing was opened for it
        if not unit.done:
            ran.append(2)
    assert ran == []
    assert (unit.result, unit.fence) == ({"label": "again", "fence": 1}, 1)
    assert bookings(alias, "again") == [1]


@COMMITS
@ALIASES
def test_an_exception_rolls_back_the_writes_and_leaves_no_row_so_a_retry_runs_again(alias):
    with pytest.raises(Boom), once(incarnation(1), using=alias) as unit:
        Booking.objects.using(alias).create(label="boom", fence=1)
        unit.result = "never recorded"
        raise Boom
    assert not unit.done
    assert bookings(alias, "boom") == [] and entries(alias) == {}

    retry = book(alias, incarnation(2), "boom")
    assert retry.result == {"label": "boom", "fence": 2}
    assert bookings(alias, "boom") == [2]


@COMMITS
@ALIASES
@pytest.mark.parametrize(
    ("result", "error"), [(object(), TypeError), (float("nan"), ValueError)], ids=["object", "nan"]
)
def test_a_result_that_is_not_json_rolls_the_unit_back(alias, result, error):
    with pytest.raises(error), once(incarnation(1), using=alias) as unit:
        Booking.objects.using(alias).create(label="not-json", fence=1)
        unit.result = result
    assert not unit.done and not connections[alias].in_atomic_block
    assert bookings(alias, "not-json") == [] and entries(alias) == {}


@COMMITS
@ALIASES
def test_once_inside_an_open_atomic_block_is_refused(alias):
    with transaction.atomic(using=alias):
        refused = pytest.raises(RuntimeError, match="outermost transaction")
        with refused, once(incarnation(1), using=alias):
            pytest.fail("the block must not run")
        Booking.objects.using(alias).create(label="outer", fence=1)
    assert entries(alias) == {}  # the refusal wrote nothing; the outer block was its own
    assert bookings(alias, "outer") == [1]


@COMMITS
@ALIASES
def test_two_parts_of_one_task_are_recorded_and_replayed_independently(alias):
    first = incarnation(1)
    book(alias, first, "part-a", part="a")
    with pytest.raises(Boom), once(first, using=alias, part="b"):
        Booking.objects.using(alias).create(label="part-b", fence=1)
        raise Boom  # fence 1 dies between its two units

    second = incarnation(2)
    a, b = book(alias, second, "part-a", part="a"), book(alias, second, "part-b", part="b")
    assert (a.fence, b.fence) == (1, 2)  # "a" replayed from its row, "b" run by fence 2
    assert bookings(alias, "part-a") == [1] and bookings(alias, "part-b") == [2]
    assert entries(alias) == {
        f"{TASK_ID}:a": (1, {"label": "part-a", "fence": 1}),
        f"{TASK_ID}:b": (2, {"label": "part-b", "fence": 2}),
    }


@COMMITS
@ALIASES
def test_an_incarnation_known_to_be_superseded_rolls_back_with_task_lost(alias):
    ctx = incarnation(1)
    with pytest.raises(TaskLost), once(ctx, using=alias) as unit:
        Booking.objects.using(alias).create(label="lost", fence=1)
        unit.result = "late"
        ctx.mark_lost()  # what the heartbeat thread does when the fence moved
    assert not unit.done and not connections[alias].in_atomic_block
    assert bookings(alias, "lost") == [] and entries(alias) == {}


@COMMITS
@ALIASES
def test_run_atomic_runs_the_body_once_and_replays_its_result_to_later_incarnations(alias):
    calls = []

    def body():
        calls.append(1)
        Booking.objects.using(alias).create(label="whole", fence=len(calls))
        return {"calls": len(calls)}

    assert run_atomic(alias, incarnation(1), body) == {"calls": 1}
    assert run_atomic(alias, incarnation(2), body) == {"calls": 1}
    assert calls == [1] and bookings(alias, "whole") == [1]


# --- a zombie racing its successor ----------------------------------------------------


def in_thread(target, *args):
    """Run ``target(*args)`` in a thread with its own connections, closed at its end;
    returns the thread and a list that gets ``target``'s result or exception."""
    outcome: list[object] = []

    def run():
        try:
            outcome.append(target(*args))
        except BaseException as exc:  # handed to the test thread, which asserts on it
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@PG
def test_a_zombie_that_leaves_its_block_after_its_successor_committed_is_rolled_back():
    # PostgreSQL runs both transactions side by side: the zombie (fence 1) wrote its row
    # and is paused inside its block when its successor (fence 2) runs the same unit and
    # commits. When the zombie goes on, the inbox row's primary key refuses it.
    paused, resume = threading.Event(), threading.Event()

    def zombie():
        with once(incarnation(1), using="pg") as unit:
            assert not unit.done
            Booking.objects.using("pg").create(label="race", fence=1)
            unit.result = {"label": "race", "fence": 1}
            paused.set()
            assert resume.wait(30)
        return unit

    thread, outcome = in_thread(zombie)
    assert paused.wait(30)
    # Finds no inbox row: the zombie writes its own only when it leaves its block.
    successor = book("pg", incarnation(2), "race")
    assert successor.fence == 2
    resume.set()
    thread.join(30)

    (unit,) = outcome
    assert isinstance(unit, Unit), unit  # no exception: the block's work was done, by fence 2
    assert (unit.done, unit.fence, unit.result) == (True, 2, {"label": "race", "fence": 2})
    assert bookings("pg", "race") == [2]  # the zombie's write was rolled back
    assert entries("pg") == {f"{TASK_ID}:": (2, {"label": "race", "fence": 2})}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_on_sqlite_a_zombie_that_writes_after_its_successor_committed_is_rolled_back():
    # SQLite has one writer at a time, so the two cannot both hold writes: the race it
    # allows is a zombie that opened its block (no write yet, no lock taken) and writes
    # only after its successor committed. The inbox row refuses it all the same.
    entered, resume = threading.Event(), threading.Event()

    def zombie():
        with once(incarnation(1), using="default") as unit:
            entered.set()
            assert resume.wait(30)
            Booking.objects.using("default").create(label="late", fence=1)
            unit.result = {"label": "late", "fence": 1}
        return unit

    thread, outcome = in_thread(zombie)
    assert entered.wait(30)
    successor, committed = in_thread(book, "default", incarnation(2), "late")
    successor.join(30)
    assert [u.fence for u in committed] == [2]
    resume.set()
    thread.join(30)

    (unit,) = outcome
    assert isinstance(unit, Unit), unit
    assert (unit.done, unit.fence, unit.result) == (True, 2, {"label": "late", "fence": 2})
    assert bookings("default", "late") == [2]
    assert entries("default") == {f"{TASK_ID}:": (2, {"label": "late", "fence": 2})}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_on_sqlite_a_successor_cannot_write_beside_a_zombie_holding_writes():
    # The other order on SQLite: the zombie holds uncommitted writes, so its successor
    # cannot take the write lock. The test database (SQLite's shared-cache memory one)
    # refuses it at once; a file database makes it wait up to its timeout, then fail or
    # meet the zombie's committed row. Its block rolls back either way, and the zombie's
    # unit is the one that commits: one incarnation's work, never two.
    wrote, resume = threading.Event(), threading.Event()

    def zombie():
        with once(incarnation(1), using="default") as unit:
            Booking.objects.using("default").create(label="held", fence=1)
            unit.result = {"fence": 1}
            wrote.set()
            assert resume.wait(30)
        return unit

    thread, outcome = in_thread(zombie)
    assert wrote.wait(30)
    blocked, refused = in_thread(book, "default", incarnation(2), "held")
    blocked.join(30)
    resume.set()
    thread.join(30)

    assert len(refused) == 1 and isinstance(refused[0], OperationalError | IntegrityError)
    assert "locked" in str(refused[0])
    (unit,) = outcome
    assert (unit.done, unit.fence) == (True, 1)
    assert bookings("default", "held") == [1]
    assert entries("default") == {f"{TASK_ID}:": (1, {"fence": 1})}


# --- the context and the decorator ----------------------------------------------------


def test_the_idempotency_key_is_the_same_for_every_incarnation_of_a_task():
    keys = {incarnation(fence).idempotency_key for fence in (1, 2, 7)}
    assert keys == {f"relier-{TASK_ID}"}
    assert incarnation(1, task_id="f" * 32).idempotency_key != incarnation(1).idempotency_key


def pushed(fence: int, push: str) -> TaskContext:
    """An incarnation of the task pushed under ``TASK_ID`` with push token ``push``."""
    ctx = incarnation(fence)
    ctx.identity = f"{TASK_ID}~{push}"
    return ctx


def test_a_later_task_under_a_reused_id_shares_no_key_with_the_earlier_one():
    """A caller-chosen id can be pushed again once its outcome expired (RESULT_TTL_S):
    the later task is another task, whose external idempotency key differs."""
    assert pushed(1, "a" * 16).idempotency_key == pushed(3, "a" * 16).idempotency_key
    assert pushed(1, "a" * 16).idempotency_key != pushed(1, "b" * 16).idempotency_key


@COMMITS
@ALIASES
def test_a_later_task_under_a_reused_id_runs_its_unit_though_the_earlier_one_s_row_is_kept(
    alias,
):
    """The inbox keeps its rows INBOX_KEEP_S (7 days); push.lua frees an id after
    RESULT_TTL_S (1 day). Keyed by the id alone, the later task found the earlier one's
    row, skipped its body and reported the earlier result (issue 35)."""
    first = book(alias, pushed(1, "a" * 16), "invoice-1")
    later = book(alias, pushed(1, "b" * 16), "invoice-1-again")
    assert first.result == {"label": "invoice-1", "fence": 1}
    assert later.result == {"label": "invoice-1-again", "fence": 1}
    assert bookings(alias, "invoice-1-again") == [1]
    assert sorted(entries(alias)) == [f"{TASK_ID}~{'a' * 16}:", f"{TASK_ID}~{'b' * 16}:"]


def test_atomic_on_an_async_task_is_refused():
    async def body(ctx):
        return None

    with pytest.raises(TypeError, match="plain `def` task"):
        rl_task(name="tests.inbox_async", atomic=True)(body)


@pytest.mark.parametrize("value", [3, "", None, ["default"]], ids=repr)
def test_atomic_takes_only_true_false_or_an_alias(value):
    with pytest.raises(TypeError, match="atomic= takes True or a database alias"):
        rl_task(name="tests.inbox_bad_atomic", atomic=value)


@COMMITS
def test_the_relay_prunes_inbox_rows_older_than_inbox_keep_s(settings, redis_client):
    from relier_django.db.outbox import Relay
    from relier_django.models import InboxEntry
    from testproject.celery import app

    settings.RELIER = {**settings.RELIER, "INBOX_KEEP_S": 3600}
    now_ms = int(time.time() * 1000)
    for alias in DATABASES:
        InboxEntry.objects.using(alias).create(
            key="old:", fence=1, result="1", committed_ms=now_ms - 7_200_000
        )
        InboxEntry.objects.using(alias).create(
            key="new:", fence=1, result="1", committed_ms=now_ms - 60_000
        )
    Relay(app)()
    for alias in DATABASES:
        assert list(InboxEntry.objects.using(alias).values_list("key", flat=True)) == ["new:"]
