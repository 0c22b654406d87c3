"""G4: N concurrent pushes of one idempotent call run once; everyone gets its result."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import REPO_ROOT, worker_env

KEYS = KeySpace("rl")


def test_50_concurrent_pushes_from_threads_and_processes_run_once(
    worker, redis_server, redis_client
):
    order = f"order-{uuid.uuid4().hex[:8]}"
    start_at = time.time() + 4  # time for the processes to import Django
    script = str(REPO_ROOT / "tests/integration/push/push_process.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(start_at), order],
            env=worker_env(redis_server.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(25)
    ]

    def push_in_thread(_: int) -> dict:
        while time.time() < start_at:
            time.sleep(0.0005)
        receipt = tasks.charge.push(order, 100, 0.5)
        return {
            "task_id": receipt.task_id,
            "dedup": receipt.deduplicated,
            "result": receipt.get(timeout=60),
        }

    with ThreadPoolExecutor(25) as pool:
        from_threads = list(pool.map(push_in_thread, range(25)))
    from_procs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        from_procs.append(json.loads(out.strip().splitlines()[-1]))

    outcomes = from_threads + from_procs
    assert len(outcomes) == 50
    assert len({o["task_id"] for o in outcomes}) == 1
    assert sum(not o["dedup"] for o in outcomes) == 1
    assert len({json.dumps(o["result"], sort_keys=True) for o in outcomes}) == 1
    assert redis_client.llen(f"demo:exec:charge:{order}") == 1  # executed exactly once


def _race(claim, rounds: int = 10, threads: int = 50) -> int:
    """Run ``threads`` simultaneous claims of one key per round; return the most
    winners seen in any round (a correct claim always gives 1)."""
    worst = 0
    for _ in range(rounds):
        barrier = threading.Barrier(threads)
        key = uuid.uuid4().hex

        def contender(_: int, key: str = key, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return claim(key)

        with ThreadPoolExecutor(threads) as pool:
            worst = max(worst, sum(pool.map(contender, range(threads))))
    return worst


def test_the_claim_is_atomic_under_a_race_that_breaks_get_then_set(redis_client):
    client = sync_client(config.current())

    def lua_claim(key: str) -> bool:
        env = Envelope(id=uuid.uuid4().hex, task="demo.charge", idem_key=key)
        return idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client).stored

    def get_then_set_claim(key: str) -> bool:  # the defect this test guards against
        redis_key = KEYS.idempotency("demo.charge", key)
        if client.get(redis_key) is None:
            client.set(redis_key, uuid.uuid4().hex)
            return True
        return False

    # The harness is sharp enough: it catches the naive version...
    assert _race(get_then_set_claim) > 1
    # ...and push.lua never lets two claims through.
    assert _race(lua_claim) == 1


def test_a_duplicate_gets_the_first_tasks_id_and_cached_result_after_commit(worker, redis_client):
    first = tasks.charge.push("o-cached", 5)
    result = first.get(timeout=30)
    again = tasks.charge.push("o-cached", 5)
    assert again.deduplicated and again.task_id == first.task_id
    assert again.get(timeout=5) == result
    assert redis_client.llen("demo:exec:charge:o-cached") == 1


def test_a_failed_send_releases_the_claim(redis_client):
    class BrokerDown(Exception):
        pass

    class DeadApp:
        def send_task(self, *args, **kwargs):
            raise BrokerDown("broker unreachable")

    import pytest

    with pytest.raises(BrokerDown):
        producer.push(tasks.charge.relier_spec, DeadApp(), ("o-down", 1), {})
    assert redis_client.dbsize() == 0  # no claim, no stored task, no index entry


def test_push_script_is_safe_to_replay_and_refuses_a_different_envelope_on_the_same_id(
    redis_client,
):
    client = sync_client(config.current())
    env = producer.prepare(tasks.charge.relier_spec, ("o-replay", 1), {})
    store = idempotency.store(KEYS, env, env.encode(), 60_000, 3)
    # A client retry after a lost reply runs the same call twice: the same answer.
    assert store.run(client) == store.run(client) == idempotency.StoreResult(True, env.id)
    other = producer.prepare(tasks.charge.relier_spec, ("o-other", 1), {}, task_id=env.id)
    taken = idempotency.store(KEYS, other, other.encode(), 60_000, 3).run(client)
    assert taken.id_taken and not taken.stored


def test_push_refuses_the_id_of_a_finished_task_while_its_outcome_is_kept(redis_client, worker):
    """A reused id (or a replayed envelope) must not run finished work a second time."""
    from relier_django.core.model.errors import DuplicateTaskId

    first = tasks.record.push("finished-once")
    assert first.get(timeout=30)["runs"] == 1
    assert not redis_client.exists(KEYS.task(first.task_id))  # the task itself is gone
    client = sync_client(config.current())
    again = producer.prepare(tasks.record.relier_spec, ("finished-twice",), {}, first.task_id)
    refused = idempotency.store(KEYS, again, again.encode(), 60_000, 3).run(client)
    assert refused.id_finished and not refused.stored
    assert not redis_client.exists(KEYS.task(first.task_id))  # nothing stored
    with pytest.raises(DuplicateTaskId, match="already run to an outcome"):
        producer.push(tasks.record.relier_spec, app, ("finished-twice",), {}, task_id=first.task_id)
