"""G1 past the commit: with ``RELIER["OUTBOX"]``, a push inside ``atomic()`` is written
into the producer's own transaction, so the commit keeps it even when the send after
the commit fails; the relay (the scanner leader's duty) sends what the commit did not,
never storing or running a task twice.

Real commits (``django_db(transaction=True)``) on SQLite and on PostgreSQL (alias
``pg``), real Redis servers (the session's, or a private one the test kills to make
Redis unreachable at the commit), and real workers where a run is counted. The relay is
called directly (``Relay(app)()``), with ``OUTBOX_GRACE_S`` 0 unless the grace is tested.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.utils import timezone

from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.observe.audit import audit
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.receipt import DispatchState
from relier_django.db.outbox import OutboxUnavailable, Relay, RelayReport, backlog, databases
from relier_django.models import OutboxEntry
from testproject.celery import app
from testproject.demo import tasks
from testproject.demo.models import Booking
from testproject.harness import CeleryWorker, process_pointed_at, redis_server
from tests.databases import ALIASES, COMMITS, HAVE_PG, PG_SKIP, Rollback

KEYS = KeySpace("rl")


@pytest.fixture
def outbox_on(settings):
    """The outbox on, and a relay that sends every committed row (no grace)."""
    settings.RELIER = {**settings.RELIER, "OUTBOX": True, "OUTBOX_GRACE_S": 0}
    return settings


@pytest.fixture
def down_at_commit(tmp_path: Path):
    """A private Redis this process (store and broker) points at; the test kills it
    inside ``atomic()`` so that the commit's send finds nothing listening."""
    with (
        redis_server(tmp_path / "redis") as server,
        process_pointed_at({"RELIER_REDIS_URL": server.url, "CELERY_BROKER_URL": server.url}),
    ):
        yield server


def pusher(task, alias: str, **options):
    """``task.push`` on the alias's transaction (and with countdown/eta/expires)."""
    using = None if alias == "default" else alias
    return task.push_with(using=using, **options).push


def rows(alias: str) -> list[OutboxEntry]:
    return list(OutboxEntry.objects.using(alias).order_by("created_ms"))


def stored(client, *task_ids: str) -> list[str]:
    """The ids among ``task_ids`` that have a task hash in ``client``'s Redis."""
    return [t for t in task_ids if client.exists(KEYS.task(t))]


def relay() -> RelayReport:
    # Rows are stamped in ms and sent when strictly older than now - grace: let the
    # clock move past the newest one.
    time.sleep(0.005)
    return Relay(app)()


def relay_in_another_thread() -> RelayReport:
    """The relay as the scanner leader runs it: its own thread, its own connections."""
    reports: list[RelayReport] = []

    def run() -> None:
        try:
            reports.append(relay())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert reports, "the relay thread did not finish"
    return reports[0]


def start_worker(server, tmp_path: Path, name: str) -> CeleryWorker:
    return CeleryWorker(redis_url=server.url, log_dir=tmp_path, name=name).start()


# --- the row lives and dies with the transaction ------------------------------------


@COMMITS
@ALIASES
def test_the_outbox_row_is_written_in_the_push_transaction_and_deleted_once_sent(
    alias, outbox_on, redis_client
):
    with transaction.atomic(using=alias):
        receipt = pusher(tasks.record, alias)(f"ob-{alias}")
        [row] = rows(alias)
        assert (row.task_id, row.task) == (receipt.task_id, "demo.record")
        assert decode(row.envelope).args == (f"ob-{alias}",)
        assert row.due_ms is None and row.expires_ms is None
        assert stored(redis_client, receipt.task_id) == []  # the commit sends, not the push
    assert receipt.dispatched
    assert rows(alias) == []
    assert stored(redis_client, receipt.task_id) == [receipt.task_id]
    assert redis_client.llen("celery") == 1


@COMMITS
@ALIASES
def test_a_rolled_back_push_leaves_no_outbox_row_and_nothing_in_redis(
    alias, outbox_on, redis_client
):
    with pytest.raises(Rollback), transaction.atomic(using=alias):
        receipt = pusher(tasks.record, alias)("ob-rolled-back")
        assert len(rows(alias)) == 1
        raise Rollback
    assert receipt.pending
    assert rows(alias) == []
    assert relay().sent == 0  # nothing committed, nothing for the relay
    assert redis_client.dbsize() == 0


@COMMITS
@ALIASES
def test_with_the_outbox_off_no_row_is_written(alias, redis_client):
    with transaction.atomic(using=alias):
        receipt = pusher(tasks.record, alias)("ob-off")
        assert rows(alias) == []
    assert receipt.dispatched and rows(alias) == []


# --- Redis unreachable at the commit ------------------------------------------------


@COMMITS
@ALIASES
def test_redis_down_at_commit_leaves_the_push_to_the_relay_which_sends_it_once(
    alias, outbox_on, down_at_commit, tmp_path, relier_log
):
    server = down_at_commit
    started = time.monotonic()
    with transaction.atomic(using=alias):
        Booking.objects.using(alias).create(label=f"down-{alias}", fence=0)
        receipt = pusher(tasks.record, alias)(f"down-{alias}")
        server.kill()
    # One attempt, no retry budget (5 s without the outbox): the row holds the push.
    assert time.monotonic() - started < 1.0
    assert receipt.dispatch_state == DispatchState.OUTBOX and receipt.in_outbox
    assert "Connection refused" in receipt.error
    assert "the outbox relay will send it" in relier_log.text
    assert not [r for r in relier_log.records if r.levelname == "ERROR"]  # nobody must act
    assert [r.task_id for r in rows(alias)] == [receipt.task_id]
    assert Booking.objects.using(alias).filter(label=f"down-{alias}").count() == 1

    outbox_on.RELIER = {**outbox_on.RELIER, "OUTBOX_GRACE_S": 60}
    assert relay() == RelayReport()  # too young: the commit's own send may be under way
    outbox_on.RELIER = {**outbox_on.RELIER, "OUTBOX_GRACE_S": 0}
    # Still down (kombu's OperationalError or redis-py's ConnectionError): the row stays.
    assert list(relay().left.values()) == [1]
    assert len(rows(alias)) == 1

    server.start()
    assert relay().sent == 1
    assert rows(alias) == []
    client = server.client()
    assert stored(client, receipt.task_id) == [receipt.task_id]
    assert client.llen("celery") == 1
    assert relay() == RelayReport()  # sent rows are gone: nothing again

    worker = start_worker(server, tmp_path, f"down-{alias}")
    try:
        assert receipt.get(timeout=30)["runs"] == 1  # get() waits through the relay
        time.sleep(1.0)
        assert client.llen(f"demo:exec:down-{alias}") == 1
        # The relay's push is in the delivery ledger, and relier_audit explains it.
        found = audit(client, KEYS, 0, slack_ms=3000)
        assert (found.noted, found.classes, found.unexplained) == (1, {"committed": 1}, 0)
    finally:
        worker.stop()


@COMMITS
@ALIASES
def test_idempotent_pushes_keep_deduplicating_through_the_relay(alias, outbox_on, down_at_commit):
    server = down_at_commit
    push = pusher(tasks.charge, alias)
    with transaction.atomic(using=alias):
        first = push(f"o-{alias}", 10)
        second = push(f"o-{alias}", 10)
        server.kill()
    assert first.in_outbox and second.in_outbox
    assert len(rows(alias)) == 2
    server.start()
    report = relay()
    # The first one sent stores the task and claims the key; the other is its duplicate.
    assert (report.sent, report.already, report.left) == (2, 0, {})
    assert rows(alias) == []
    client = server.client()
    assert len(stored(client, first.task_id, second.task_id)) == 1
    assert client.llen("celery") == 1
    again = tasks.charge.push(f"o-{alias}", 10)  # sent at once: still the same claim
    assert again.deduplicated
    assert again.duplicate_of in (first.task_id, second.task_id)


@COMMITS
@ALIASES
def test_countdown_and_eta_keep_their_original_due_time_through_the_relay(
    alias, outbox_on, down_at_commit
):
    server = down_at_commit
    eta = timezone.now() + timedelta(minutes=2)
    with transaction.atomic(using=alias):
        later = pusher(tasks.record, alias, countdown=60, expires=300)("ob-later")
        at_eta = pusher(tasks.record, alias, eta=eta)("ob-eta")
        soon = pusher(tasks.record, alias, countdown=0.3)("ob-soon")
        server.kill()
    by_id = {r.task_id: r for r in rows(alias)}
    created = by_id[later.task_id].created_ms
    # Absolute times, from the push's clock: a countdown does not restart at the relay.
    assert by_id[later.task_id].due_ms == created + 60_000
    assert by_id[later.task_id].expires_ms == created + 300_000
    assert by_id[at_eta.task_id].due_ms == int(eta.timestamp() * 1000)

    time.sleep(1.0)  # relayed a second late: "soon" is overdue by then
    server.start()
    assert relay().sent == 3
    client = server.client()
    for receipt in (later, at_eta):
        row = by_id[receipt.task_id]
        assert client.hget(KEYS.task(receipt.task_id), "state") == b"scheduled"
        assert int(client.hget(KEYS.task(receipt.task_id), "due_ms")) == row.due_ms
        assert client.zscore(KEYS.schedule, receipt.task_id) == row.due_ms
    assert int(client.hget(KEYS.task(later.task_id), "expires_ms")) == created + 300_000
    assert client.hget(KEYS.task(soon.task_id), "state") == b"queued"
    assert client.llen("celery") == 1  # "soon" alone: queued at once, overdue


# --- the relay and the commit's send, both sending --------------------------------


@COMMITS
@ALIASES
def test_a_row_whose_push_was_already_sent_is_dropped_without_a_second_store(
    alias, outbox_on, worker_factory, redis_client
):
    with transaction.atomic(using=alias):
        receipt = pusher(tasks.record, alias)(f"lost-delete-{alias}")
        kept = OutboxEntry.objects.using(alias).filter(task_id=receipt.task_id).values().get()
    assert receipt.dispatched and rows(alias) == []
    # The commit's send stored it, then its delete was lost (the process died, the
    # database connection broke): the committed row is back for the relay.
    OutboxEntry.objects.using(alias).create(**kept)

    report = relay()
    assert (report.sent, report.already) == (1, 0)  # push.lua: "already stored", as is
    assert rows(alias) == []
    task = KEYS.task(receipt.task_id)
    assert redis_client.hget(task, "pushers") == b"2"  # two calls told "stored"...
    assert redis_client.llen("celery") == 1  # ...one stored task, one message

    worker_factory()
    assert receipt.get(timeout=30)["runs"] == 1
    # Once it has run, the same row again is answered as the push it repeats (its
    # outcome names the push): nothing is stored or sent, nothing runs again.
    OutboxEntry.objects.using(alias).create(**kept)
    report = relay()
    assert (report.sent, report.already) == (1, 0)
    assert redis_client.llen("celery") == 0 and not redis_client.exists(task)
    assert rows(alias) == []
    time.sleep(1.0)
    assert redis_client.llen(f"demo:exec:lost-delete-{alias}") == 1


@COMMITS
@ALIASES
def test_the_relay_sending_before_the_commit_send_stores_and_runs_once(
    alias, outbox_on, worker_factory, redis_client
):
    reports: list[RelayReport] = []
    label = f"race-{alias}"
    with transaction.atomic(using=alias):
        # Django runs on_commit callbacks in registration order: this one, registered
        # before the push, relays the committed row before the push's own send.
        transaction.on_commit(lambda: reports.append(relay_in_another_thread()), using=alias)
        receipt = pusher(tasks.record, alias)(label)
    assert [r.sent for r in reports] == [1]
    assert receipt.dispatched  # the commit's send was answered "already stored"
    assert rows(alias) == []
    assert redis_client.hget(KEYS.task(receipt.task_id), "pushers") == b"2"
    assert redis_client.llen("celery") == 1

    worker_factory()
    assert receipt.get(timeout=30)["runs"] == 1
    time.sleep(1.0)
    assert redis_client.llen(f"demo:exec:{label}") == 1


# --- rows the relay cannot send -----------------------------------------------------


@COMMITS
def test_a_row_of_an_unknown_task_or_a_bad_envelope_stays_and_is_reported(
    outbox_on, redis_client, relier_log
):
    cfg = config.current()
    now = int(time.time() * 1000) - 1000
    gone = Envelope(id=uuid.uuid4().hex, task="demo.gone", args=("x",), created_ms=now)
    OutboxEntry.objects.create(
        task_id=gone.id, task=gone.task, envelope=gone.encode(cfg.signer), created_ms=now
    )
    real = Envelope(id=uuid.uuid4().hex, task="demo.record", args=("x",), created_ms=now)
    tampered = real.encode(cfg.signer).replace('"x"', '"y"')
    OutboxEntry.objects.create(task_id=real.id, task=real.task, envelope=tampered, created_ms=now)

    report = relay()
    assert (report.sent, report.already) == (0, 0)
    assert report.left == {"LookupError": 1, "EnvelopeError": 1}
    # Left for a process that knows the task, or for a human: never dropped.
    assert {r.task_id for r in rows("default")} == {gone.id, real.id}
    assert backlog()["default"] == 2
    assert "left for the next pass" in relier_log.text
    assert redis_client.dbsize() == 0


# --- several databases --------------------------------------------------------------


@pytest.mark.skipif(not HAVE_PG, reason=PG_SKIP)
@COMMITS
def test_each_push_writes_its_row_in_the_database_it_waits_for(outbox_on, redis_client):
    with transaction.atomic(using="pg"), transaction.atomic(using="default"):
        on_pg = [tasks.record.push_with(using="pg").push(f"pg-{i}") for i in range(2)]
        on_default = tasks.record.push("default-0")
        assert {r.task_id for r in rows("pg")} == {r.task_id for r in on_pg}
        assert [r.task_id for r in rows("default")] == [on_default.task_id]
        # backlog() reads through this thread's connections: inside both transactions.
        assert backlog() == {"default": 1, "pg": 2}
    assert all(r.dispatched for r in [*on_pg, on_default])
    assert backlog() == {"default": 0, "pg": 0}
    assert databases() == ["default", "pg"]


@COMMITS
@ALIASES
def test_a_missing_outbox_table_refuses_the_push_naming_migrate(alias, outbox_on, redis_client):
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("DROP TABLE relier_outbox")  # DDL in a transaction: rolled back
        with pytest.raises(OutboxUnavailable, match=f"migrate relier_django --database {alias}"):
            pusher(tasks.record, alias)("no-table")
        # Caught: the failed write has marked the transaction for rollback all the same,
        # and with it the push's send: a push without its row is never sent.
    assert "relier_outbox" in connections[alias].introspection.table_names()
    time.sleep(0.3)
    assert redis_client.dbsize() == 0
