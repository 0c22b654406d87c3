"""The tasks: their modules import, their timeouts fit, their queues are consumed, and
``beat_schedule``'s entries can be fired."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import current_app
from celery.app.routes import Router, prepare
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning

from .. import conf
from ..core.model import links
from ..core.schedule import periodic, ticks
from ..core.task import RelierTask
from ..readers import discovery
from .common import TAG
from .settings import _settings


def _relier_tasks() -> list[RelierTask]:
    discovery.import_task_modules()
    return [task for task in current_app.tasks.values() if isinstance(task, RelierTask)]


@register(TAG)
def check_task_imports(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E013: a module in Celery's ``imports`` or ``include`` that cannot be
    imported: a worker would not start, and the task checks cannot see its tasks.

    Returns:
        One error per such module.
    """
    return [
        Error(
            f"The module {name!r} in Celery's imports (CELERY_IMPORTS or "
            f"CELERY_INCLUDE) cannot be imported: {type(exc).__name__}: {exc}.",
            hint="Correct the module path, or the error in the module; a worker fails to "
            "start on it too.",
            id="relier.E013",
        )
        for name, exc in discovery.import_task_modules()
    ]


@register(TAG)
def check_task_timeouts(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E006: a task whose soft timeout is not below its hard timeout.

    ``@rl_task`` already refuses this; the check covers specs built another way.

    Returns:
        One error per such task.
    """
    errors: list[CheckMessage] = []
    for task in _relier_tasks():
        spec = task.relier_spec
        soft, hard = spec.soft_timeout_s, spec.hard_timeout_s
        if soft is not None and hard is not None and soft >= hard:
            errors.append(
                Error(
                    f"Task {task.name!r} has soft_timeout ({soft:g} s) >= hard_timeout "
                    f"({hard:g} s): its on_soft_timeout hook would never run before the "
                    "hard stop.",
                    hint=f"Give {task.name} a soft_timeout below its hard_timeout, e.g. "
                    f"@rl_task(soft_timeout={hard * 0.8:g}, hard_timeout={hard:g}), or drop "
                    "soft_timeout.",
                    id="relier.E006",
                )
            )
    return errors


@register(TAG)
def check_task_queues(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.W003: a task published to a queue that no worker consumes.

    A task's queue is its ``@rl_task(queue=)``, else Celery's ``task_routes`` for its
    name, else ``task_default_queue``. The consumed queues are ``WORKER_QUEUES`` when set,
    else the names in Celery's ``task_queues``, else ``task_default_queue``; the recovery
    queue always counts, since every worker consumes it. A route given by a function
    that needs the task's arguments cannot be followed, and is not reported.

    Returns:
        One warning per task whose queue no worker consumes.
    """
    found = _settings()
    if found is None:
        return []
    cfg, django_settings = found
    app = current_app
    consumed, source, fix = _consumed_queues(app.conf, django_settings)
    consumed.add(cfg.recovery_queue)
    router = Router(routes=prepare(app.conf.task_routes), app=app)
    warnings: list[CheckMessage] = []
    for task in _relier_tasks():
        queue = _task_queue(router, task.relier_spec.queue, task.name, app.conf)
        if queue is None or queue in consumed:
            continue
        warnings.append(
            CheckWarning(
                f"Task {task.name!r} is published to the queue {queue!r}, which no worker "
                f"consumes according to {source} ({', '.join(sorted(consumed))}): each "
                f"push would wait QUEUED_GRACE_S ({cfg.queued_grace_s:g} s) until the "
                "resurrector re-dispatches it to the recovery queue.",
                hint=f"Run a worker with -Q {queue} and {fix(queue)}; or route the task to a "
                "consumed queue.",
                id="relier.W003",
            )
        )
    return warnings


@register(TAG)
def check_periodic_schedule(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E008 (a ``beat_schedule`` entry naming no registered task), relier.E009 (a
    schedule that is not seconds, a ``timedelta`` or a ``crontab``, or an interval that
    is infinite, NaN, not above 0 or above 100 years), relier.E010 (an
    entry relier cannot push: its args, kwargs or options), relier.W005 (an entry for a
    plain Celery task: relier does not fire it, celery beat must run for it).

    Returns:
        One message per entry relier's scanners will not fire.
    """
    discovery.import_task_modules()  # as _relier_tasks: the check sees every task
    # beat_schedule alone: a check reads no database (django-celery-beat's rows that
    # relier cannot fire are logged by the scanner and shown on the admin's page).
    _, rejected = periodic.read_entries(current_app, sources=False)
    where = "Celery's beat_schedule (CELERY_BEAT_SCHEDULE)"
    messages: list[CheckMessage] = []
    for bad in rejected:
        entry = f"Periodic entry {bad.entry!r} in {where}"
        if bad.problem is periodic.Problem.NOT_RELIER:
            messages.append(CheckWarning(
                f"{entry} names a plain Celery task ({bad.detail}): relier's scanners fire "
                "only @rl_task entries, so this one runs only while celery beat runs.",
                hint="Run one `celery -A <proj> beat` for it (and only one), or make the task "
                f"an @rl_task so relier fires it exactly once; {links.doc('scheduling.md')}.",
                id="relier.W005",
            ))  # fmt: skip
        elif bad.problem is periodic.Problem.UNKNOWN_TASK:
            messages.append(Error(
                f"{entry}: {bad.detail}; it would never fire.",
                hint="Correct its 'task' to a registered task name (the @rl_task's `name=`, "
                "or its module path and function name), or remove the entry.",
                id="relier.E008",
            ))  # fmt: skip
        elif bad.problem is periodic.Problem.BAD_SCHEDULE:
            messages.append(Error(
                f"{entry}: its 'schedule' {bad.detail}.",
                hint="Give 'schedule' a finite number of seconds > 0 and at most 100 years "
                "(e.g. 30.0), a datetime.timedelta, or a celery.schedules.crontab(...).",
                id="relier.E009",
            ))  # fmt: skip
        else:
            messages.append(Error(
                f"{entry} cannot be pushed: {bad.detail}.",
                hint="Give the entry 'args' (a list) and 'kwargs' (a dict) that fit the "
                "task's signature, and 'options' a dict whose "
                f"'{periodic.MISSED_OPTION}' is one of "
                f"{', '.join(repr(m.value) for m in ticks.Missed)}.",
                id="relier.E010",
            ))  # fmt: skip
    return messages


# What Celery's beat_scheduler may be to mean django-celery-beat's DatabaseScheduler.
_DATABASE_SCHEDULERS = ("django", "django_celery_beat.schedulers:DatabaseScheduler")


@register(TAG)
def check_celery_beat_models(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E017 (``CELERY_BEAT_MODELS`` on without django-celery-beat installed),
    relier.W010 (``CELERY_BEAT_MODELS`` on while Celery's ``beat_scheduler`` is
    django-celery-beat's ``DatabaseScheduler``: a beat would fire the ``@rl_task`` rows
    too, so each of their ticks would run twice).

    Returns:
        The messages; none while the setting is off.
    """
    from django.apps import apps

    found = _settings()
    if found is None or not found[1].celery_beat_models:
        return []
    if not apps.is_installed("django_celery_beat"):
        return [Error(
            "RELIER['CELERY_BEAT_MODELS'] is on, but django-celery-beat is not in "
            "INSTALLED_APPS: no row of it is fired.",
            hint="pip install 'relier-django[celery-beat]' and add 'django_celery_beat' to "
            f"INSTALLED_APPS, or turn the setting off; {links.doc('scheduling.md')}.",
            id="relier.E017",
        )]  # fmt: skip
    scheduler = str(current_app.conf.beat_scheduler or "")
    if scheduler not in _DATABASE_SCHEDULERS:
        return []
    return [CheckWarning(
        f"Celery's beat_scheduler is {scheduler!r} while RELIER['CELERY_BEAT_MODELS'] is "
        "on: a celery beat run with it applies the @rl_task rows too, and relier's "
        "scanners fire them as well, so each of their ticks would run twice.",
        hint="Run beat with -S relier_django.beat:DatabaseScheduler (it leaves the "
        "@rl_task rows to relier and runs the others), or run no celery beat; "
        f"{links.doc('scheduling.md')}.",
        id="relier.W010",
    )]  # fmt: skip


def _consumed_queues(
    celery_conf: Any, django_settings: conf.DjangoSettings
) -> tuple[set[str], str, Callable[[str], str]]:
    """The queues workers consume, where that was read from, and how to add one."""
    if django_settings.worker_queues is not None:
        return (
            set(django_settings.worker_queues),
            "RELIER['WORKER_QUEUES']",
            lambda q: f"add {q!r} to RELIER['WORKER_QUEUES']",
        )
    declared = celery_conf.task_queues
    if declared:
        names = declared.keys() if isinstance(declared, Mapping) else map(_queue_name, declared)
        return (
            {name for name in names if name},
            "Celery's task_queues",
            lambda q: (
                f"declare {q!r} in Celery's task_queues (or list your workers' -Q "
                "queues in RELIER['WORKER_QUEUES'])"
            ),
        )
    return (
        {celery_conf.task_default_queue},
        "Celery's task_default_queue (task_queues is not set)",
        lambda q: (
            f"list your workers' -Q queues in RELIER['WORKER_QUEUES'] (or declare "
            f"{q!r} in Celery's task_queues)"
        ),
    )


def _queue_name(queue: Any) -> str | None:
    if isinstance(queue, str):
        return queue
    name = getattr(queue, "name", None)  # a kombu.Queue
    return name if isinstance(name, str) else None


def _task_queue(router: Router, own: str | None, name: str, celery_conf: Any) -> str | None:
    """The queue ``push()`` publishes the task to; None when it depends on arguments."""
    if own:
        return own
    try:
        route = router.lookup_route(name, (), {}, {}, None)
    except Exception:  # a router function may need real arguments: then we cannot tell
        return None
    if route is None:
        return str(celery_conf.task_default_queue)
    if isinstance(route, Mapping):
        return _queue_name(route.get("queue"))
    return _queue_name(route)
