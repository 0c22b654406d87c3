"""on_commit-aware push: the Django side of the core's transaction hook.

Inside ``transaction.atomic()`` (on the database a push names with
``push_with(using=...)``, the default one otherwise), ``push()`` validates its
arguments at once and leaves the store and the send to
``transaction.on_commit``, so a rollback leaves no trace in Redis or the broker.
Outside a transaction (autocommit) it sends at once. See docs/transactions.md.
"""

from __future__ import annotations

from collections.abc import Callable

from celery import current_app
from django.db import transaction

from ..core.push import producer
from ..core.store.receipt import Receipt
from ..readers import discovery


def defer_until_commit(using: str | None, callback: Callable[[], None]) -> bool:
    """The core's ``TransactionHook`` for Django.

    Returns False when this thread's connection to ``using`` is not inside an atomic
    block (autocommit, or manual transaction management, where Django itself would
    refuse ``on_commit``): the push is then sent at once. Otherwise registers
    ``callback`` with ``on_commit``, so it runs after the outermost block commits,
    is dropped with a rolled-back savepoint, and never runs after a rollback.

    Reading ``in_atomic_block`` opens no connection and does no I/O, so this is safe
    from async code too (connections are per thread; an event loop's thread is in an
    atomic block only when ``asyncio.run()`` was called inside one).

    Raises:
        django.utils.connection.ConnectionDoesNotExist: ``using`` is not in DATABASES.
    """
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return False
    # robust: should the callback ever raise despite catching its own errors, Django
    # logs it and still runs the other on_commit callbacks.
    connection.on_commit(callback, robust=True)
    return True


def install() -> None:
    """Called from ``AppConfig.ready()``: make ``push()`` wait for commits."""
    producer.set_transaction_hook(defer_until_commit)


def replay(envelope: str) -> Receipt:
    """Push, now, the envelope of a post-commit send that gave up (it is in the ERROR
    log line ``push after commit NOT dispatched ... envelope=<JSON>``).

    Safe to repeat: the task keeps its id; a second copy of a stored task is refused
    by the worker (one start per fence), and a replay of a task that finished within
    ``RESULT_TTL_S`` raises ``DuplicateTaskId``. Imports the project's task modules
    first, as a worker does, so it works from a fresh ``manage.py shell``. See
    ``relier_django.core.push.producer.replay``.
    """
    discovery.import_task_modules()
    return producer.replay(current_app, envelope)
