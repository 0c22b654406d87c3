"""Proofs that the test harness itself does what the rest of the suite relies on."""

from __future__ import annotations

import psutil
import pytest

from testproject.harness import wait_until


def test_private_redis_is_configured_for_durability(redis_server, redis_client):
    config = redis_client.config_get("*")
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "everysec"
    assert config["maxmemory-policy"] == "noeviction"
    assert int(config["port"]) == redis_server.port != 6379
    assert config["dir"] == str(redis_server.directory)


@pytest.mark.parametrize("round_", [1, 2])
def test_each_test_starts_with_an_empty_server(redis_client, round_):
    # The second round fails if the flush between tests does not happen.
    assert redis_client.dbsize() == 0
    redis_client.set("leftover", round_)


def test_a_key_written_before_a_redis_crash_survives_restart_from_aof(redis_server, redis_client):
    redis_client.set("acknowledged", "yes")
    old_pid = redis_server.pid
    redis_server.restart()
    assert redis_server.pid != old_pid
    fresh = redis_server.client()
    assert fresh.get("acknowledged") == b"yes"
    fresh.close()


def test_a_task_runs_end_to_end_on_a_real_worker(worker, redis_client):
    from testproject.demo.tasks import plain_record

    plain_record.delay("e2e")
    wait_until(lambda: redis_client.get("demo:plain:e2e") == b"1", 30, what="task execution")


def test_sigkill_of_a_child_is_seen_and_the_pool_replaces_it(worker):
    before = {p.pid for p in worker.children()}
    assert len(before) == 2
    killed = worker.kill_child()

    def replaced() -> bool:
        now = {p.pid for p in worker.children()}
        return len(now) == 2 and killed not in now

    wait_until(replaced, 30, what="the pool to replace the killed child")
    assert worker.alive()


def test_sigstop_pauses_every_process_and_sigcont_resumes_them(worker, redis_client):
    from testproject.demo.tasks import plain_record

    group = [psutil.Process(worker.pid), *worker.children()]
    worker.stop_group()
    wait_until(lambda: all(p.status() == psutil.STATUS_STOPPED for p in group), 10, what="SIGSTOP")
    plain_record.delay("paused")
    worker.cont_group()
    wait_until(lambda: redis_client.get("demo:plain:paused") == b"1", 30, what="run after SIGCONT")


def test_sigterm_is_a_warm_shutdown_of_the_whole_worker(worker):
    children = worker.children()
    worker.terminate(wait_s=30)
    assert worker.process.returncode == 0
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)


def test_sigkill_of_the_whole_worker_leaves_no_process(worker):
    group = [psutil.Process(worker.pid), *worker.children()]
    worker.kill()
    wait_until(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in group),
        10,
        what="every worker process to be gone",
    )
