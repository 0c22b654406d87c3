"""Import every module a worker imports for its tasks, in any process.

A Celery worker imports each installed app's ``tasks`` module (``autodiscover_tasks()``)
and the modules in Celery's ``imports`` and ``include`` (``CELERY_IMPORTS``) before it
takes a message. A web process, ``manage.py shell`` or ``manage.py check`` imports
none of them by itself, so a lookup by task name there (``replay()``, the system
checks) would miss tasks a worker knows.
"""

from __future__ import annotations

import importlib

from celery import current_app
from django.utils.module_loading import autodiscover_modules


def import_task_modules() -> list[tuple[str, Exception]]:
    """Import each app's ``tasks`` module and the modules of Celery's ``imports`` and
    ``include``. Cheap once done: Python caches imported modules.

    Returns:
        The modules of ``imports``/``include`` that could not be imported, with their
        errors (a worker fails to start on them too).
    """
    autodiscover_modules("tasks")
    failed = []
    names = [*(current_app.conf.imports or ()), *(current_app.conf.include or ())]
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported by the caller, never raised here
            failed.append((name, exc))
    return failed
