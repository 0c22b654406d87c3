"""G1 past the commit, with real processes: a producer SIGKILLed between its commit and
its push's send, or committing while Redis is down, loses nothing; a worker's scanner
leader relays the committed outbox row, and the task runs exactly once.

On SQLite and PostgreSQL (``shared_db``): the producer (tests/chaos/outbox_producer.py)
and the worker share one migrated database.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

from relier_django import result
from relier_django.core.store.keys import KeySpace
from testproject.harness import REPO_ROOT, free_port, wait_until, worker_env

KEYS = KeySpace("rl")
PRODUCER = REPO_ROOT / "tests" / "chaos" / "outbox_producer.py"


def produce(redis_url: str, shared_db, label: str, mode: str, **env: str):
    """Run the producer to its end (or its death); returns it and its JSON lines."""
    done = subprocess.run(
        [sys.executable, str(PRODUCER), label, mode],
        cwd=REPO_ROOT,
        env=worker_env(redis_url, shared_db.env(RELIER_OUTBOX="1", **env)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done, lines


def outbox_ids(shared_db) -> list[str]:
    return [row[0] for row in shared_db.query("SELECT task_id FROM relier_outbox")]


def bookings(shared_db, label: str) -> int:
    return len(shared_db.query("SELECT id FROM demo_booking WHERE label = %s", [label]))


def relayed_once(shared_db, worker_factory, redis_client, label: str, task_id: str) -> None:
    """A worker's relay sends the row; the task runs once and the row is gone."""
    worker = worker_factory(extra_env=shared_db.env(RELIER_OUTBOX_GRACE_S="1"))
    assert result(task_id).get(timeout=20)["runs"] == 1
    wait_until(lambda: outbox_ids(shared_db) == [], 10, what="the relay to delete the row")
    assert "outbox relay sent a push its commit did not" in worker.log_text()
    time.sleep(2.5)  # more relay passes (every SCAN_INTERVAL_S): nothing is sent again
    assert redis_client.llen(f"demo:exec:{label}") == 1


def test_a_producer_killed_between_commit_and_send_loses_nothing(
    shared_db, redis_server, redis_client, worker_factory
):
    label = f"killed-{shared_db.kind}-{uuid.uuid4().hex[:6]}"
    done, lines = produce(redis_server.url, shared_db, label, "die")
    assert done.returncode == -signal.SIGKILL, done.stderr
    [pushed] = lines  # the line after the commit never came
    task_id = pushed["task_id"]
    # Died after the commit, before the send: the booking and the outbox row are
    # committed, and Redis has never heard of the task.
    assert bookings(shared_db, label) == 1
    assert outbox_ids(shared_db) == [task_id]
    assert not redis_client.exists(KEYS.task(task_id))
    assert redis_client.llen("celery") == 0

    relayed_once(shared_db, worker_factory, redis_client, label, task_id)


def test_a_producer_committing_while_redis_is_down_loses_nothing(
    shared_db, redis_server, redis_client, worker_factory
):
    label = f"down-{shared_db.kind}-{uuid.uuid4().hex[:6]}"
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done, lines = produce(closed, shared_db, label, "send")
    assert done.returncode == 0, done.stderr
    pushed, committed = lines
    task_id = pushed["task_id"]
    assert committed["state"] == "outbox"
    # One attempt, then the commit returns: no 5 s retry budget in the request.
    assert committed["commit_s"] < 2.0
    assert "the outbox relay will send it" in done.stderr
    assert bookings(shared_db, label) == 1
    assert outbox_ids(shared_db) == [task_id]
    assert redis_client.dbsize() == 0

    relayed_once(shared_db, worker_factory, redis_client, label, task_id)
