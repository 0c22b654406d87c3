"""G1 inside transactions: a push inside ``atomic()`` is stored and sent when the
transaction commits, and leaves nothing anywhere when it rolls back.

Real commits (``django_db(transaction=True)``), on SQLite and on PostgreSQL (alias
``pg``: the session's private server, which tests/conftest.py starts), a real Redis and
real Celery workers. The broker is the same private Redis, so "no key in Redis" also means
"no message sent".
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils.connection import ConnectionDoesNotExist

from relier_django.core.model.envelope import decode
from relier_django.core.push import aftercommit
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.receipt import DispatchState, NotDispatched, Receipt
from relier_django.transactions import replay
from testproject.demo import tasks
from testproject.harness import CeleryWorker, free_port, process_pointed_at, redis_server
from tests.databases import ALIASES, COMMITS, HAVE_PG, PG_SKIP, Rollback

KEYS = KeySpace("rl")


def pusher(task, alias: str):
    """``task.push`` for the default database, ``task.push_with(using=alias).push`` else."""
    return task.push if alias == "default" else task.push_with(using=alias).push


def runs(client, label: str) -> int:
    return int(client.llen(f"demo:exec:{label}"))


def traces(client, task_id: str) -> list[str]:
    """Every key or index entry a push leaves for ``task_id`` (none when it never happened)."""
    found = [k for k in (KEYS.task(task_id), KEYS.history(task_id)) if client.exists(k)]
    if client.zscore(KEYS.expiry, task_id) is not None:
        found.append(f"{KEYS.expiry}[{task_id}]")
    return found


def logged_envelope(caplog, task_id: str) -> str:
    """The envelope in the ERROR line a post-commit send that gave up wrote for ``task_id``."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and f"task_id={task_id}" in r.getMessage()
    ]
    assert len(lines) == 1, f"expected one ERROR line for {task_id}, got {lines}"
    assert "push after commit NOT dispatched" in lines[0]
    return lines[0].split(" envelope=", 1)[1]


# --- commit, rollback, savepoints ----------------------------------------------------


@COMMITS
@ALIASES
def test_a_push_inside_atomic_is_sent_at_commit_and_runs_exactly_once(alias, worker, redis_client):
    with transaction.atomic(using=alias):
        receipt = pusher(tasks.record, alias)(f"commit-{alias}")
        assert receipt.pending and receipt.dispatch_state == DispatchState.PENDING
        assert len(receipt.task_id) == 32  # known now, e.g. to store it in the same transaction
        time.sleep(0.5)  # a live worker would run it now if it had been sent
        assert traces(redis_client, receipt.task_id) == []
        assert runs(redis_client, f"commit-{alias}") == 0
    assert receipt.dispatched and not receipt.deduplicated
    assert receipt.get(timeout=30) == {"label": f"commit-{alias}", "fence": 1, "runs": 1}
    time.sleep(0.3)
    assert runs(redis_client, f"commit-{alias}") == 1


@COMMITS
@ALIASES
def test_a_rolled_back_push_is_never_stored_nor_sent(alias, redis_client):
    with pytest.raises(Rollback), transaction.atomic(using=alias):
        plain = pusher(tasks.record, alias)("rolled-back")
        claim = pusher(tasks.charge, alias)("order-rb", 10)  # idempotent: claims nothing
        raise Rollback
    assert plain.pending and claim.pending  # forever: nothing will ever send them
    # The broker is this Redis: an empty server means nothing was stored, no message
    # was sent, no idempotency key was claimed and the resurrector has nothing to find.
    assert redis_client.dbsize() == 0
    with pytest.raises(NotDispatched, match="waits for its transaction to commit"):
        plain.get(timeout=1)
    again = tasks.charge.push("order-rb", 10)  # the key is free: this one runs
    assert again.dispatched and not again.deduplicated


@COMMITS
@ALIASES
def test_a_rolled_back_savepoint_drops_its_pushes_and_the_commit_sends_the_rest(
    alias, worker, redis_client
):
    push = pusher(tasks.record, alias)
    with transaction.atomic(using=alias):
        kept = push(f"sp-kept-{alias}")
        with transaction.atomic(using=alias):
            inner = push(f"sp-inner-{alias}")
        assert inner.pending  # a released savepoint still waits for the outer commit
        with pytest.raises(Rollback), transaction.atomic(using=alias):
            dropped = push(f"sp-dropped-{alias}")
            raise Rollback
        after = push(f"sp-after-{alias}")
    assert [r.dispatch_state for r in (kept, inner, dropped, after)] == [
        "dispatched",
        "dispatched",
        "pending",
        "dispatched",
    ]
    for receipt in (kept, inner, after):
        assert receipt.get(timeout=30)["runs"] == 1
    time.sleep(0.5)
    assert runs(redis_client, f"sp-dropped-{alias}") == 0
    assert traces(redis_client, dropped.task_id) == []


@COMMITS
@ALIASES
def test_idempotent_duplicates_are_found_at_commit_and_share_one_run(alias, worker, redis_client):
    push = pusher(tasks.charge, alias)
    with transaction.atomic(using=alias):
        first = push(f"o-{alias}", 10)
        second = push(f"o-{alias}", 10)
        # Ids are assigned at push: two of them, until the commit finds the duplicate.
        assert first.task_id != second.task_id and first.pending and second.pending
    assert first.dispatched
    assert second.deduplicated and second.duplicate_of == first.task_id
    assert second.get(timeout=30) == first.get(timeout=30)
    assert runs(redis_client, f"charge:o-{alias}") == 1
    assert traces(redis_client, second.task_id) == []  # its own id was never used


@COMMITS
def test_on_commit_false_sends_at_once_inside_the_block(worker, redis_client):
    with pytest.raises(Rollback), transaction.atomic():
        receipt = tasks.record.push_with(on_commit=False).push("now")
        assert receipt.dispatched
        assert receipt.get(timeout=30)["runs"] == 1  # ran while the transaction was open
        raise Rollback
    assert runs(redis_client, "now") == 1  # the rollback did not take it back


@COMMITS
def test_outside_a_transaction_push_sends_at_once(redis_client):
    receipt = tasks.record.push("autocommit")
    assert receipt.dispatched
    assert traces(redis_client, receipt.task_id) != []


@COMMITS
def test_bad_arguments_raise_inside_the_block_and_nothing_is_deferred(redis_client):
    with transaction.atomic():
        with pytest.raises(TypeError, match="argument 'label' is a object"):
            tasks.record.push(object())
        with pytest.raises(TypeError, match=r"demo\.record: too many"):
            tasks.record.push("a", "b", "c")
    assert redis_client.dbsize() == 0


# --- several databases ---------------------------------------------------------------


@COMMITS
def test_push_waits_for_the_database_it_names(redis_client):
    with transaction.atomic(using="default"):
        on_default = tasks.record.push("on-default")
        assert on_default.pending
    if HAVE_PG:
        with transaction.atomic(using="pg"):
            # push() watches the default database, which is in autocommit here.
            assert tasks.record.push("default-is-autocommit").dispatched
            assert tasks.record.push_with(using="pg").push("on-pg").pending
    assert on_default.dispatched
    with pytest.raises(ConnectionDoesNotExist):
        tasks.record.push_with(using="nope").push("x")
    with pytest.raises(ValueError, match="pass one or the other"):
        tasks.record.push_with(on_commit=False, using="default")
    with pytest.raises(TypeError, match="database alias"):
        tasks.record.push_with(using=1)


@pytest.mark.skipif(not HAVE_PG, reason=PG_SKIP)
@COMMITS
def test_the_worker_sees_the_row_its_transaction_wrote(worker_factory, redis_client):
    # The race on_commit exists for: a task that reads what its producer just wrote.
    # The worker reads the same PostgreSQL test database.
    db = connections["pg"].settings_dict
    login = f"{db['USER']}:{db['PASSWORD']}" if db["PASSWORD"] else db["USER"]
    url = f"postgres://{login}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    worker_factory(extra_env={"TESTPROJECT_POSTGRES_URL": url})
    from django.contrib.auth.models import User

    with transaction.atomic(using="pg"):
        User.objects.db_manager("pg").create_user("committed-buyer")
        receipt = tasks.count_users.push_with(using="pg").push("row", "committed-buyer", using="pg")
        time.sleep(1.0)  # had it been sent, the worker would have counted 0 by now
    assert receipt.get(timeout=30) == 1
    assert redis_client.lrange("demo:seen:row", 0, -1) == [b"1"]


# --- ATOMIC_REQUESTS ------------------------------------------------------------------


class ViewFailed(Exception):
    pass


VIEW_RECEIPTS: dict[str, Receipt] = {}


def order_view(request: HttpRequest, alias: str, label: str, outcome: str) -> JsonResponse:
    receipt = pusher(tasks.record, alias)(label)
    VIEW_RECEIPTS[label] = receipt
    if outcome == "fail":
        raise ViewFailed("the view failed after pushing")
    return JsonResponse({"task_id": receipt.task_id, "state": receipt.dispatch_state})


urlpatterns = [path("order/<str:alias>/<str:label>/<str:outcome>/", order_view)]


@pytest.mark.urls(__name__)
@COMMITS
@ALIASES
def test_atomic_requests_send_when_the_view_commits_and_never_when_it_fails(
    alias, client, monkeypatch, worker, redis_client
):
    monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", True)
    response = client.get(f"/order/{alias}/view-ok-{alias}/ok/")
    assert response.status_code == 200
    assert response.json()["state"] == "pending"  # inside the view, before the commit
    done = VIEW_RECEIPTS[f"view-ok-{alias}"]
    assert done.dispatched and done.get(timeout=30)["runs"] == 1

    with pytest.raises(ViewFailed):
        client.get(f"/order/{alias}/view-fail-{alias}/fail/")
    failed = VIEW_RECEIPTS[f"view-fail-{alias}"]
    assert failed.pending
    time.sleep(0.5)
    assert runs(redis_client, f"view-fail-{alias}") == 0
    assert traces(redis_client, failed.task_id) == []


# --- async code ---------------------------------------------------------------------


@COMMITS
def test_apush_waits_only_for_a_transaction_its_own_async_context_opened(redis_client, monkeypatch):
    async def view() -> Receipt:
        return await tasks.record.apush("async-now")

    with transaction.atomic():
        # Django gives async code connections of its own: this thread's transaction is
        # not the coroutine's, so apush() sends at once (docs/transactions.md).
        assert asyncio.run(view()).dispatched

    # Only where async code may open atomic() itself does apush() wait for it.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    async def owns_a_transaction() -> Receipt:
        try:
            with transaction.atomic():
                receipt = await tasks.record.apush("async-own-transaction")
                assert receipt.pending
            return receipt
        finally:
            connections["default"].close()  # this async context's own connection

    assert asyncio.run(owns_a_transaction()).dispatched


@pytest.mark.django_db
def test_capture_on_commit_callbacks_dispatches_in_a_test_case(
    django_capture_on_commit_callbacks, redis_client
):
    # A plain django_db test runs inside a transaction that never commits: pushes wait.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        receipt = tasks.record.push("in-testcase")
        assert receipt.pending
    assert len(callbacks) == 1 and receipt.dispatched


# --- admission control at commit ---------------------------------------------------


@COMMITS
def test_a_push_refused_at_commit_is_retried_after_retry_after(redis_client, relier_log):
    with transaction.atomic():
        receipts = [tasks.per_second.push(f"ps-{i}") for i in range(3)]  # limit: 2/s
    assert all(r.dispatched for r in receipts)
    assert "push after commit failed, retrying" in relier_log.text
    assert "reason=AdmissionRejected" in relier_log.text
    assert redis_client.llen("celery") == 3


@COMMITS
def test_a_refusal_longer_than_the_budget_is_logged_with_its_envelope(redis_client, relier_log):
    for i in range(3):
        tasks.limited.push(f"lim-{i}")  # fills the 3/m window
    started = time.monotonic()
    with transaction.atomic():
        receipt = tasks.limited.push("lim-late")
    assert time.monotonic() - started < 1  # Retry-After ~60 s > budget: no pointless wait
    assert receipt.send_failed and "AdmissionRejected" in receipt.error
    envelope = logged_envelope(relier_log, receipt.task_id)
    assert decode(envelope).args == ("lim-late",)
    assert traces(redis_client, receipt.task_id) == [] and redis_client.llen("celery") == 3
    with pytest.raises(NotDispatched, match="replay"):
        receipt.get(timeout=1)


# --- the send fails after the commit -------------------------------------------------


@COMMITS
def test_a_broker_down_at_commit_is_retried_then_logged_and_the_envelope_replays(
    worker_factory, redis_client, relier_log
):
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with process_pointed_at({"CELERY_BROKER_URL": closed}):
        started = time.monotonic()
        with transaction.atomic():
            receipt = tasks.record.push("broker-down")
        elapsed = time.monotonic() - started
    # Gives up when the next pause would end past the budget: within a second of it.
    assert aftercommit.SEND_BUDGET_S - 1 <= elapsed < aftercommit.SEND_BUDGET_S + 5
    assert receipt.send_failed and receipt.error
    assert relier_log.text.count("push after commit failed, retrying") >= 3
    envelope = logged_envelope(relier_log, receipt.task_id)
    # Each failed send was undone: no stored copy, no claim, nothing for the resurrector,
    # and no push counted.
    assert redis_client.dbsize() == 0

    worker_factory()
    replayed = replay(envelope)
    assert replayed.task_id == receipt.task_id
    assert replayed.get(timeout=30)["runs"] == 1


@COMMITS
def test_redis_down_at_commit_and_back_within_the_budget_dispatches(tmp_path: Path):
    with redis_server(tmp_path / "redis") as server:
        env = {"RELIER_REDIS_URL": server.url, "CELERY_BROKER_URL": server.url}
        with process_pointed_at(env):
            back = threading.Timer(1.5, server.start)  # Redis is down for 1.5 s
            with transaction.atomic():
                receipt = tasks.record.push("redis-blip")
                server.kill()
                back.start()
            # The commit's send retried until Redis was back.
            back.join()
            assert receipt.dispatched
            worker = CeleryWorker(redis_url=server.url, log_dir=tmp_path, name="blip").start()
            try:
                assert receipt.get(timeout=30)["runs"] == 1
            finally:
                worker.stop()


@COMMITS
def test_redis_down_past_the_budget_logs_the_envelope_and_it_replays(tmp_path, relier_log):
    with redis_server(tmp_path / "redis") as server:
        env = {"RELIER_REDIS_URL": server.url, "CELERY_BROKER_URL": server.url}
        with process_pointed_at(env):
            with transaction.atomic():
                receipt = tasks.record.push("redis-down")
                server.kill()
            # Raised by the publish that builds the message, or by push.lua: refused either way.
            assert receipt.send_failed and "Connection refused" in receipt.error
            envelope = logged_envelope(relier_log, receipt.task_id)
            server.start()
            assert server.client().dbsize() == 0  # nothing was stored: replay is the way
            replayed = replay(envelope)
            assert replayed.task_id == receipt.task_id == json.loads(envelope)["id"]
            replay(envelope)  # by mistake, before it ran: a second copy of fence 1...
            worker = CeleryWorker(redis_url=server.url, log_dir=tmp_path, name="down").start()
            try:
                assert replayed.get(timeout=30)["runs"] == 1
                time.sleep(1.0)  # ...which the worker refuses: one start per fence
                assert server.client().llen("demo:exec:redis-down") == 1
                # After it committed: answered as the push it repeats (the outcome names
                # the push), its result read back, nothing run again.
                again = replay(envelope)
                assert again.task_id == receipt.task_id and again.get(timeout=5)["runs"] == 1
                time.sleep(1.0)
                assert server.client().llen("demo:exec:redis-down") == 1
            finally:
                worker.stop()
