"""A django.tasks task whose worker is SIGKILLed mid-run (issue 24): brought back by
relier (its holder's connection closed), it runs once more elsewhere and its
TaskResult is SUCCESSFUL exactly once, with one worker id per incarnation."""

from __future__ import annotations

from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import jobs
from testproject.harness import wait_until

try:
    from django.tasks import TaskResultStatus
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus

KEYS = KeySpace("rl")


def test_a_worker_killed_mid_task_gives_one_success_and_two_worker_ids(worker_factory):
    client = sync_client(config.current())
    survivor = worker_factory(name="survivor", queues=("elsewhere",))
    doomed = worker_factory(name="doomed")
    result = jobs.slow.enqueue("dt-kill", 2.0)
    wait_until(lambda: jobs.slow.get_result(result.id).status == TaskResultStatus.RUNNING, 30)
    doomed.kill()  # SIGKILL: main process and pool, nothing handed off

    def finished() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(finished, 60, what="the task to finish elsewhere")
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "dt-kill"
    assert result.attempts == 2
    first, second = result.worker_ids
    assert doomed.hostname in first and survivor.hostname in second
    assert client.lrange("demo:exec:dt-kill", 0, -1) == ["2"]  # the killed run never finished
    assert len(client.lrange("demo:start:dt-kill", 0, -1)) == 2
