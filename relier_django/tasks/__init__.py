"""Django's task framework (``django.tasks``, DEP 14) on relier_django: ``RelierBackend``.

::

    TASKS = {
        "default": {
            "BACKEND": "relier_django.tasks.RelierBackend",
            "QUEUES": ["default", "emails"],  # optional: the queue names tasks may use
            "OPTIONS": {"USING": "default"},  # optional, see below
        }
    }

A task declared with Django's ``@task`` runs on the project's Celery workers (the same
``celery -A proj worker`` that runs ``@rl_task``), with everything an ``@rl_task`` has:
the envelope stored before it is sent, heartbeats, resurrection of a dead worker's
task (found by its closed connection in about a second), fencing (a zombie cannot
commit), retries, timeouts and the dead-letter queue. Each task is an ``@rl_task``
named after its module path (``myapp.tasks.send_email``), declared when its module is
imported; a worker imports it as Celery imports any task (an app's ``tasks.py``,
``CELERY_IMPORTS``). A message for a task no worker knows lands in the DLQ with reason
``unknown_task``, never in the void.

Relier's options go into ``@task(...)`` (Django 6.1 forwards extra keyword arguments to
the backend's ``task_class``, :class:`ReliableTask`)::

    @task(idempotent=True, max_retries=5, retry_on=(TimeoutError,), hard_timeout=60)
    def charge(order_id: int) -> dict: ...

What the backend says it supports, and why:

- ``supports_defer``: ``run_after`` waits in relier's durable schedule (Redis), not in
  a broker or a worker's memory; it runs once, never before its time.
- ``supports_async_task``: an ``async def`` task runs on the worker's event loop.
- ``supports_get_result``: ``get_result`` reads the store, from any process.
- ``supports_priority``: of the tasks waiting in one queue, a higher priority is taken
  first, on every broker; django.tasks' -100..100 maps onto relier's 0..9 in ten equal
  bands (``backend.celery_priority``: the default 0 is 4), with the starvation bound of
  docs/priorities.md.

``enqueue`` inside ``transaction.atomic()`` waits for the commit, as ``push`` does: the
task is stored and sent when the transaction commits, never if it rolls back; its
``TaskResult`` (status ``READY``, its id fixed) comes back at once. The database whose
transaction counts is ``OPTIONS["USING"]`` (default: Django's default database). So
Django's ``transaction.on_commit(partial(my_task.enqueue, ...))`` idiom is not needed
(it also works: the send then happens outside any transaction).

``TaskResult``, from the store: ``READY`` (queued, scheduled, or waiting to be brought
back after a death or a failed attempt), ``RUNNING``, ``SUCCESSFUL`` (its committed
return value), ``FAILED`` (in the DLQ, with the error that put it there;
``relier_dlq release`` or the admin runs it again). ``worker_ids`` has one entry per
incarnation that started, so ``attempts`` counts resurrections and retries.
A finished task's ``TaskResult`` is kept as long as its result (``RESULT_TTL_S``).

Django's ``task_enqueued`` signal is sent by ``enqueue`` (at the commit when it waits
for one), ``task_started`` by the worker as the incarnation starts, ``task_finished``
once the outcome is settled: committed (``SUCCESSFUL``) or dead-lettered (``FAILED``).

On Django 5.2 this module uses the ``django-tasks`` backport package
(``pip install "relier-django[tasks]"``, and ``"django_tasks"`` in ``INSTALLED_APPS``).
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from django.core.exceptions import ImproperlyConfigured

__all__ = ["ReliableTask", "RelierBackend"]

# Celery's autodiscovery imports every installed app's ``tasks`` module, this one
# included, in every worker: it must import cleanly where neither API is installed.
if find_spec("django.tasks") is not None or find_spec("django_tasks") is not None:
    from .backend import ReliableTask, RelierBackend
else:

    class RelierBackend:  # type: ignore[no-redef]
        """Stands in when neither django.tasks nor its backport is installed."""

        def __init__(self, alias: str, params: Any) -> None:
            raise ImproperlyConfigured(
                f'TASKS["{alias}"] names relier_django.tasks.RelierBackend, which needs '
                "django.tasks (Django 6) or, on Django 5.2, the django-tasks backport: "
                'pip install "relier-django[tasks]" and add "django_tasks" to INSTALLED_APPS'
            )

    ReliableTask = None  # type: ignore[assignment,misc]
