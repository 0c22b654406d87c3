"""Celery's calls on an @rl_task keep Celery's meaning, with relier's guarantees (issue 20).

``delay``/``apply_async``/signatures push an envelope (stored, fenced) and a worker runs
it; ``task(...)``, ``run()`` and ``apply()`` run the body in this process and touch no
Redis; options relier cannot honour yet raise and say so; a beat entry naming the
task pushes it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relier_django.core.model.envelope import decode
from relier_django.core.schedule import periodic
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import REPO_ROOT, wait_until, worker_env

KEYS = KeySpace("rl")


def runs(client, label: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.decode() for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def _stored(client, task_id: str):  # type: ignore[no-untyped-def]
    return decode(client.hget(KEYS.task(task_id), "env"))


def test_delay_pushes_an_envelope_and_a_worker_runs_it(worker, redis_client):
    receipt = tasks.sync_record.delay("via-delay")
    assert receipt.id == receipt.task_id
    assert receipt.get(timeout=30)["label"] == "via-delay"
    assert len(runs(redis_client, "via-delay")) == 1


def test_apply_async_pushes_with_its_task_id_and_queue(redis_client):
    receipt = tasks.sync_record.apply_async(("q-label",), {"sleep_s": 0}, task_id="t-1", queue="q7")
    assert receipt.task_id == "t-1"
    env = _stored(redis_client, "t-1")
    assert (env.args, env.kwargs, env.queue, env.fence) == (("q-label",), {"sleep_s": 0}, "q7", 1)
    (raw,) = redis_client.lrange("q7", 0, -1)
    assert json.loads(raw)["headers"]["relier_fence"] == 1  # an envelope, not bare arguments


def test_a_signature_applies_as_a_push(worker, redis_client):
    assert tasks.sync_record.s("by-sig").apply_async().get(timeout=30)["label"] == "by-sig"
    assert tasks.sync_record.si("by-si").delay().get(timeout=30)["label"] == "by-si"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"routing_key": "q"}, "queue="),
    ],
)
def test_an_option_it_cannot_honour_is_refused_and_nothing_is_pushed(options, says, redis_client):
    with pytest.raises(TypeError, match=says):
        tasks.sync_record.apply_async(("never",), **options)
    assert redis_client.dbsize() == 0


def test_a_link_whose_task_cannot_take_what_comes_first_is_refused_at_push(redis_client):
    # link= and link_error= are supported (tests/integration/workflows/test_link.py): a callback
    # takes the result first, an errback the failed task's id, checked at push.
    with pytest.raises(TypeError):
        tasks.sync_record.apply_async(("a",), link=tasks.sync_record.s("b", 0.0))
    with pytest.raises(TypeError):
        tasks.sync_record.apply_async(("a",), link_error=tasks.sync_record.s("b", 0.0))
    assert redis_client.dbsize() == 0


def test_calling_the_task_runs_its_body_here_and_touches_no_redis(redis_client):
    assert tasks.unserializable.run("r") is not None  # the body, as Celery's run() is
    result = tasks.charge("o-here", 5)  # ctx-taking body: a fresh context is made
    assert result["order_id"] == "o-here" and result["amount"] == 5
    (run,) = runs(redis_client, "charge:o-here")
    assert run.startswith("0:")  # fence 0: an inline context, not an incarnation
    assert redis_client.keys("rl:*") == []  # no envelope, no DLQ entry


def test_apply_runs_eagerly_and_reports_success_or_failure_like_celery(redis_client):
    ok = tasks.charge.apply(("o-eager", 7))
    assert ok.successful() and ok.get()["amount"] == 7
    failed = tasks.explode.apply(("boom",))
    assert failed.state == "FAILURE" and isinstance(failed.result, Exception)
    assert redis_client.keys("rl:*") == []


@contextlib.contextmanager
def _beat(url: str, tmp_path: Path, env: dict[str, str], *args: str) -> Iterator[None]:
    """A real ``celery beat`` for the block's duration, logging to tmp_path/beat.log,
    stopped by SIGTERM (SIGKILL if it lingers)."""
    with open(tmp_path / "beat.log", "wb") as log:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "testproject", "beat", "--loglevel", "INFO",
             "--schedule", str(tmp_path / "beat-schedule"), "--max-interval", "1", *args],
            cwd=REPO_ROOT, env=worker_env(url, env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield
        finally:
            beat.send_signal(signal.SIGTERM)
            try:
                beat.wait(timeout=20)
            except subprocess.TimeoutExpired:
                beat.kill()
                beat.wait()


def test_a_beat_entry_naming_the_task_pushes_it_and_a_worker_runs_it(
    worker, redis_server, redis_client, tmp_path
):
    with _beat(redis_server.url, tmp_path, {"DEMO_BEAT_EVERY_S": "1"}):
        wait_until(lambda: len(runs(redis_client, "beat")) >= 2, 60, what="two beat ticks run")
    text = (tmp_path / "beat.log").read_text()
    assert "ERROR" not in text, text[-3000:]
    # Each tick was a relier push: its own task id, fence 1, run once.
    fences = [r.split(":")[0] for r in runs(redis_client, "beat")]
    assert set(fences) == {"1"}


def test_beat_with_relier_scheduler_and_a_worker_firing_the_same_entry_runs_each_tick_once(
    worker_factory, redis_server, redis_client, tmp_path
):
    # Both fire demo.sync_record every second: the worker's scanner and a celery beat
    # on relier's scheduler. Each tick is claimed: every tick runs once, none twice.
    every = {"DEMO_BEAT_EVERY_S": "1"}
    worker_factory(extra_env=every)
    with _beat(redis_server.url, tmp_path, every, "-S", "relier_django.beat:Scheduler"):
        wait_until(lambda: len(runs(redis_client, "beat")) >= 4, 60, what="four ticks run")
    time.sleep(1.5)  # a tick fired as beat stopped has time to run
    done = {k.decode().split("{")[1].rstrip("}") for k in redis_client.keys("rl:r:*")}
    # Every run came through a claimed tick (its id is the tick's), none from beat's
    # own apply_async: so no tick ran twice.
    ticks = {int(s) * 1000 for s in range(int(time.time()) - 120, int(time.time()) + 2)}
    assert done <= {periodic.tick_id("demo-beat", t) for t in ticks}
    assert len(runs(redis_client, "beat")) == len(done)
    assert "ERROR" not in (tmp_path / "beat.log").read_text()
