"""Django's own expectations of a task backend (django/django ``tests/tasks/``), adapted
to ``RelierBackend``: a real backend whose tasks run in another process, on a Celery
worker, and whose results are read back from the store.

Taken (adapted, not copied; test_django_tasks.py already covers the rest):

- ``test_tasks.py`` ``TaskTestCase``: the decorator gives a ``Task`` whose
  ``module_path`` imports back to it; ``using()`` returns a new task and keeps every
  other option (chained); ``run_after`` must be aware; a function not at module level
  is refused; ``takes_context`` needs a first argument named ``context``;
  ``run_after`` cannot be given to ``@task``; a task and a ``TaskResult`` pickle;
  ``call``/``acall``; ``enqueue``/``aenqueue`` return a READY result with the task
  and its (JSON-normalised) arguments; a non-JSON argument raises ``TypeError``;
  ``get_result``/``aget_result`` of a fresh result equals it; ``refresh``/``arefresh``
  of a result that has not run changes nothing; another task's id raises
  ``TaskResultMismatch``.
- ``test_immediate_backend.py`` ``ImmediateBackendTestCase``: a finished task's
  status, timestamps (set and ordered), ``attempts``, ``None`` as a return value;
  exceptions (``ValueError``, an exception wrapping one) recorded with their class
  path and a traceback ending in ``Name: message`` (``SystemExit`` differs, as on any
  Celery worker: it ends the pool process, which relier takes for a death); a return value JSON
  cannot carry fails the task with ``TypeError``; ``takes_context`` (here for an
  ``async def`` task); validation against the backend in force at ``enqueue`` and
  ``aenqueue``; the ``enqueued`` log line.
- ``test_dummy_backend.py`` ``DummyBackendTestCase``: before it runs, a result has no
  start or finish time and its ``return_value`` raises "not finished"; ``get_result``
  gives the task back as it was enqueued (its ``queue_name``, its ``run_after``).
- ``test_custom_backend.py`` ``CustomBackendTestCase``: the backend's alias and
  ``OPTIONS`` come from its ``TASKS`` entry.

Left out, and why:

- ImmediateBackend's "the task ran by the time ``enqueue`` returns" (and its
  transaction test, "does not wait for the commit"): this backend runs tasks on a
  worker, and waits for the commit (test_django_tasks.py proves that);
  ``KeyboardInterrupt`` re-raised by ``enqueue``: nothing runs in the caller.
- ImmediateBackend's "cannot get or refresh a result" and "cannot pass run_after":
  this backend supports both.
- DummyBackend's ``results`` list, ``clear()`` and the ``ENQUEUE_ON_COMMIT`` tests:
  a DummyBackend API (the latter from before Django 6.0), not a backend contract.
- ``TaskTestCase``'s unknown or missing backend alias, ``no backends``, and
  ``TaskError`` with a bad class path: Django's handler and ``TaskError`` alone, no
  backend code runs; priority ranges: Django's own validation (-100..100), before any
  backend code (test_django_tasks.py proves it; celery_compat/test_priorities.py the order).
- ``TaskResult`` ordering, equality by id and hashing, ``test_metadata.py``: APIs of a
  Django newer than the one this project runs (6.1 has none of them).
- ``test_custom_backend.py``'s abstract ``enqueue`` and async-on-a-sync-backend:
  this backend implements ``enqueue`` and supports async tasks.
- ``test_utils.py`` and ``tests.py``: Django's helpers and an early prototype API,
  not backend behaviour.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from relier_django.tasks import ReliableTask
from testproject.demo import conformance_jobs as jobs
from testproject.harness import wait_until

try:
    from django.tasks import Task, TaskResultStatus, default_task_backend, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultMismatch
    from django.tasks.signals import task_enqueued

    FRAMEWORK_LOGGER = "django.tasks"
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django_tasks.base import Task
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultMismatch
    from django_tasks.signals import task_enqueued

    FRAMEWORK_LOGGER = "django_tasks"
# Django 6's Task pickles (Task.__reduce__); the django-tasks backport's does not.
TASKS_PICKLE = hasattr(Task, "_reconstruct")

S = TaskResultStatus
# What refresh() reloads (django.tasks.base.TASK_REFRESH_ATTRS).
_REFRESHED = (
    "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at",
    "errors", "worker_ids", "_return_value",
)  # fmt: skip


def _finished(result: Any, timeout_s: float = 30) -> Any:
    def done() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(done, timeout_s, what=f"task {result.id} to finish")
    return result


def _state(result: Any) -> tuple[Any, ...]:
    return tuple(getattr(result, name) for name in _REFRESHED)


def _not_started(result: Any) -> None:
    assert result.status == S.READY and result.is_finished is False
    assert result.started_at is None and result.last_attempted_at is None
    assert result.finished_at is None
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018 - the property raises


def _ran_in_order(result: Any) -> None:
    assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.started_at <= result.finished_at


class _Enqueued:
    """The ``task_enqueued`` signals this process sends while it is connected."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    def __call__(self, sender: Any, task_result: Any, **_: Any) -> None:
        self.results.append(task_result)

    def __enter__(self) -> _Enqueued:
        task_enqueued.connect(self, weak=False, dispatch_uid="conformance")
        return self

    def __exit__(self, *_: object) -> None:
        task_enqueued.disconnect(dispatch_uid="conformance")


# -- the task and the backend, before anything is enqueued ---------------------------
def test_the_backend_is_built_from_its_tasks_entry():
    backend = task_backends["default"]
    assert default_task_backend.alias == backend.alias
    assert backend.alias == "default" and backend.options == {}
    assert backend.queues == {"default", "emails"}


def test_the_decorator_gives_a_reliable_task_whose_module_path_imports_back():
    for declared in (jobs.noop, jobs.anoop):
        assert isinstance(declared, Task) and isinstance(declared, ReliableTask)
        assert declared.name == declared.func.__name__
        assert declared.module_path == f"testproject.demo.conformance_jobs.{declared.name}"
        assert import_string(declared.module_path) is declared
        assert declared.get_backend() is task_backends["default"]


def test_using_returns_a_new_task_and_keeps_every_other_option():
    original = jobs.fail_system_exit
    same = original.using()
    assert same == original and same is not original
    due = timezone.now() + timedelta(hours=1)
    routed = original.using(queue_name="emails")
    deferred = routed.using(run_after=due)
    assert (deferred.queue_name, deferred.run_after) == ("emails", due)
    assert isinstance(deferred, ReliableTask) and deferred.max_resurrections == 0
    assert routed.run_after is None
    assert (original.queue_name, original.run_after) == ("default", None)


def test_run_after_must_be_an_aware_datetime():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        jobs.noop.using(run_after=datetime.now())  # naive on purpose


def test_a_function_not_at_module_level_is_refused():
    def nested() -> None:
        return None

    for func in (any, nested, lambda: None):
        with pytest.raises(InvalidTask, match="defined at a module level"):
            task()(func)


def test_takes_context_needs_a_first_argument_named_context_and_run_after_is_not_static():
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(jobs.meaning.func)
    # Django 6 names the rule; the backport fails on the duplicate keyword.
    with pytest.raises(TypeError, match="run_after"):
        task(run_after=timezone.now())(jobs.meaning.func)


def test_call_and_acall_run_the_function_here_without_the_backend():
    assert jobs.meaning.call() == 42
    assert asyncio.run(jobs.meaning.acall()) == 42
    assert jobs.anoop.call() is None
    assert asyncio.run(jobs.anoop.acall()) is None


def test_a_task_with_relier_options_pickles():
    deferred = jobs.fail_system_exit.using(run_after=timezone.now() + timedelta(hours=1))
    if not TASKS_PICKLE:  # the framework's own limit on Django 5.2, not the backend's
        with pytest.raises(pickle.PicklingError):
            pickle.dumps(deferred)
        return
    again = pickle.loads(pickle.dumps(deferred))
    assert again == deferred and again.max_resurrections == 0


# -- enqueue and results, with no worker: the task stays READY -------------------------
def test_enqueue_returns_a_ready_result_with_normalised_arguments(redis_client):
    result = jobs.noop.enqueue(1, (2, 3), two=(3,))
    assert result.task == jobs.noop and result.backend == "default"
    assert isinstance(result.id, str) and result.id
    assert result.args == [1, [2, 3]] and result.kwargs == {"two": [3]}
    assert result.enqueued_at is not None and timezone.is_aware(result.enqueued_at)
    _not_started(result)
    stored = jobs.noop.get_result(result.id)
    assert (stored.id, stored.args, stored.kwargs) == (result.id, [1, [2, 3]], {"two": [3]})
    _not_started(stored)


def test_a_task_result_pickles(redis_client):
    result = jobs.noop.using(queue_name="emails").enqueue(1, two=[3])
    if not TASKS_PICKLE:  # its task does not pickle on the backport (above)
        with pytest.raises(pickle.PicklingError):
            pickle.dumps(result)
        return
    assert pickle.loads(pickle.dumps(result)) == result


def test_aenqueue_returns_a_ready_result_for_sync_and_async_tasks(redis_client):
    async def go(declared: Any) -> Any:
        return await declared.aenqueue()

    for declared in (jobs.noop, jobs.anoop):
        result = asyncio.run(go(declared))
        assert result.task == declared and (result.args, result.kwargs) == ([], {})
        _not_started(result)
        _not_started(asyncio.run(declared.aget_result(result.id)))


def test_a_result_read_back_before_it_runs_equals_the_one_enqueue_returned(redis_client):
    result = jobs.noop.enqueue(1, two=2)
    assert jobs.noop.get_result(result.id) == result
    assert asyncio.run(jobs.noop.aget_result(result.id)) == result


def test_refreshing_a_result_that_has_not_run_changes_nothing(redis_client):
    result = jobs.noop.enqueue()
    before = _state(result)
    result.refresh()
    assert _state(result) == before
    asyncio.run(result.arefresh())
    assert _state(result) == before


def test_another_tasks_id_is_a_mismatch_not_a_result(redis_client):
    other = jobs.anoop.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        jobs.noop.get_result(other.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        asyncio.run(jobs.noop.aget_result(other.id))


def test_a_non_json_argument_is_refused_and_nothing_is_stored(redis_client):
    keys_before = redis_client.dbsize()
    with _Enqueued() as sent:
        with pytest.raises(TypeError):
            jobs.noop.enqueue(datetime.now())
        with pytest.raises(TypeError):
            asyncio.run(jobs.noop.aenqueue(when=timezone.now()))
    assert sent.results == [] and redis_client.dbsize() == keys_before


def test_enqueue_validates_against_the_backend_in_force(redis_client, settings):
    routed = jobs.noop.using(queue_name="emails")  # valid when it is made
    settings.TASKS = {
        "default": {"BACKEND": "relier_django.tasks.RelierBackend", "QUEUES": ["default"]}
    }
    keys_before = redis_client.dbsize()
    with pytest.raises(InvalidTask, match="Queue 'emails' is not valid"):
        routed.enqueue()
    with pytest.raises(InvalidTask, match="Queue 'emails' is not valid"):
        asyncio.run(routed.aenqueue())
    assert redis_client.dbsize() == keys_before


def test_the_enqueued_result_holds_the_task_as_it_was_enqueued(redis_client):
    due = timezone.now() + timedelta(hours=1)
    deferred = jobs.noop.using(queue_name="emails").using(run_after=due)
    result = deferred.enqueue()
    assert result.task == deferred
    assert (result.task.queue_name, result.task.run_after) == ("emails", due)


def test_get_result_gives_back_the_task_with_its_queue_name(redis_client):
    routed = jobs.noop.using(queue_name="emails")
    result = routed.enqueue()
    assert jobs.noop.get_result(result.id).task.queue_name == "emails"


def test_get_result_gives_back_the_task_with_its_run_after(redis_client):
    due = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    result = jobs.noop.using(run_after=due).enqueue()
    assert jobs.noop.get_result(result.id).task.run_after == due


# -- task_enqueued, in the enqueuing process -------------------------------------------
def test_enqueue_and_aenqueue_send_task_enqueued_once_and_log_it(redis_client, caplog):
    with _Enqueued() as sent, caplog.at_level(logging.DEBUG, logger=FRAMEWORK_LOGGER):
        first = jobs.noop.enqueue()
        second = asyncio.run(jobs.anoop.aenqueue())
    assert [r.id for r in sent.results] == [first.id, second.id]
    assert all(r.status == S.READY for r in sent.results)
    logged = [r.getMessage() for r in caplog.records if r.name == FRAMEWORK_LOGGER]
    for result in (first, second):
        assert [m for m in logged if result.id in m and "enqueued" in m], logged


@pytest.mark.django_db(transaction=True)
def test_inside_atomic_task_enqueued_waits_for_the_commit_and_a_rollback_sends_none(
    redis_client,
):
    with _Enqueued() as sent:
        with transaction.atomic():
            kept = jobs.noop.enqueue()
            assert sent.results == []
        assert [r.id for r in sent.results] == [kept.id]
        with pytest.raises(RuntimeError), transaction.atomic():
            jobs.noop.enqueue()
            raise RuntimeError("roll back")
    assert [r.id for r in sent.results] == [kept.id]


# -- on a worker -----------------------------------------------------------------------
def test_a_task_returning_none_is_successful_with_its_arguments(worker):
    for declared in (jobs.noop, jobs.anoop):
        result = _finished(declared.enqueue(1, two=3))
        assert result.status == S.SUCCESSFUL and result.is_finished is True
        assert result.return_value is None and result.errors == []
        assert (result.args, result.kwargs, result.attempts) == ([1], {"two": 3}, 1)
        assert result.task == declared
        _ran_in_order(result)


def test_an_exception_is_recorded_with_its_class_path_and_traceback(worker):
    result = _finished(jobs.fail_value_error.enqueue())
    assert result.status == S.FAILED and result.is_finished is True
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    _ran_in_order(result)
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: conformance failed with a ValueError\n")
    assert (result.args, result.kwargs) == ([], {})


def test_an_exception_wrapping_an_exception_is_recorded(worker):
    result = _finished(jobs.fail_complex_exception.enqueue())
    assert result.status == S.FAILED and result._return_value is None
    _ran_in_order(result)
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert 'ValueError(ValueError("conformance failed' in error.traceback


def test_a_system_exit_ends_the_pool_process_and_is_filed_as_a_death(worker):
    # Django's ImmediateBackend records a SystemExit as the task's failure. On a Celery
    # worker it ends the pool process, as in Celery: relier takes it for a death and
    # runs the task again until max_resurrections (0 here), then files it
    # (resurrection_limit). docs/django-tasks.md says so.
    result = _finished(jobs.fail_system_exit.enqueue(), timeout_s=60)
    assert result.status == S.FAILED
    (error,) = result.errors
    assert error.exception_class_path == "relier_django.core.model.errors.TaskFailed"
    assert error.traceback.startswith("resurrection_limit")


def test_a_return_value_json_cannot_carry_fails_the_task_with_a_type_error(worker):
    result = _finished(jobs.complex_return.enqueue())
    assert result.status == S.FAILED and result._return_value is None
    _ran_in_order(result)
    (error,) = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback


def test_a_return_value_is_normalised_as_django_keeps_it(worker):
    result = _finished(jobs.normalised_return.enqueue())
    assert result.return_value == {"tuple": [1, [2, 3]], "bytes": "text", "none": None}


def test_an_async_task_taking_context_is_told_its_running_result(worker):
    result = _finished(jobs.context_seen.enqueue("ctx"))
    assert result.return_value == {
        "label": "ctx", "id": result.id, "attempt": 1, "status": "RUNNING", "args": ["ctx"],
    }  # fmt: skip


def test_a_running_task_is_running_and_has_no_return_value_yet(worker):
    result = jobs.sleeper.enqueue(3)

    def running() -> bool:
        result.refresh()
        return result.status == S.RUNNING

    wait_until(running, 30, what="the task to start")
    assert result.is_finished is False and result.finished_at is None
    assert result.started_at is not None and result.last_attempted_at == result.started_at
    assert result.attempts == 1 and result.errors == []
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    _finished(result)
    assert result.status == S.SUCCESSFUL and result.return_value == 3


def test_queue_name_sends_the_task_to_that_celery_queue(worker_factory):
    worker_factory(queues=("emails",))  # consumes nothing but "emails"
    result = _finished(jobs.meaning.using(queue_name="emails").enqueue())
    assert result.status == S.SUCCESSFUL and result.return_value == 42
