"""The admission check on its own, for code that wants to know before it starts work
whether a push of a task would be admitted (docs/admission.md)::

    from relier_django import admission

    verdict = admission.check("shop.charge")  # or: await admission.acheck("shop.charge")
    if not verdict.admitted:
        return HttpResponse(status=429, headers={"Retry-After": ceil(verdict.retry_after_s)})

It counts one unit on the limits that apply to the task (the global one, the task's
``ADMISSION_TASK_LIMITS`` entry or its ``admission_limit``), exactly as ``push()``
would, in one script (``admit.lua``); a task with no limit is always admitted and
costs no round trip. One attempt, never retried: a ``redis.exceptions.ConnectionError``
or ``TimeoutError`` means the outcome is unknown (the unit may have been counted, which
only ever errs towards refusing).
"""

from __future__ import annotations

from celery import current_app

from . import conf
from .core.push import admission as _admission
from .core.push.admission import Admission
from .core.store.connection import sync_client
from .core.store.keys import KeySpace

__all__ = ["Admission", "acheck", "check"]

_ADMITTED = Admission(True, 0.0)


def _limits(task_name: str) -> tuple[_admission.Limit, ...]:
    cfg = conf.get_config()
    spec = getattr(current_app.tasks.get(task_name), "relier_spec", None)
    own = getattr(spec, "admission_limit", None)
    return _admission.limits(KeySpace.of(cfg), cfg, task_name, own)


def check(task_name: str) -> Admission:
    """Admit (and count) one unit of work of ``task_name``, from sync code."""
    found = _limits(task_name)
    if not found:
        return _ADMITTED
    return _admission.check(found).run(sync_client(conf.get_config(), fail_fast=True))


async def acheck(task_name: str) -> Admission:
    """Admit (and count) one unit of work of ``task_name``, from async code: concurrent
    checks on one event loop share one pipelined connection."""
    found = _limits(task_name)
    if not found:
        return _ADMITTED
    return await _admission.acheck(found, conf.get_config())
