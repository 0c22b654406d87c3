"""A ``celery beat`` scheduler for a project whose schedule holds ``@rl_task`` entries.

``CELERY_BEAT_SCHEDULER = "relier_django.beat:Scheduler"`` (or ``celery beat -S
relier_django.beat:Scheduler``): beat runs the plain Celery entries as it always does,
and fires the ``@rl_task`` ones through relier's claims instead of its own
``apply_async``, as a scanner does (``core.schedule.periodic.fire_due``). So any number
of beats, workers and resurrectors fire each tick of those entries exactly once, and a
beat alone (no worker up at the tick) still fires them.

``relier_django.beat:DatabaseScheduler`` is django-celery-beat's ``DatabaseScheduler``
made the same way (needs the ``celery-beat`` extra): beat runs the rows naming a plain
Celery task, and leaves the ``@rl_task`` rows to relier, which fires them (with
``RELIER["CELERY_BEAT_MODELS"]`` on) exactly once.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.beat import PersistentScheduler

from .core.model import config
from .core.schedule import periodic
from .core.store.connection import sync_client

logger = logging.getLogger("relier_django.beat")


class _RelierEntries:
    """Beat's scheduler with ``@rl_task`` entries left to relier's claims."""

    app: Any

    def apply_entry(self, entry: Any, producer: Any = None) -> Any:
        if _is_relier(self.app, entry.task):
            return None  # fired, claimed and recorded by fire_due() in tick()
        return super().apply_entry(entry, producer=producer)  # type: ignore[misc]

    def tick(self, *args: Any, **kwargs: Any) -> float:
        wait_s = float(super().tick(*args, **kwargs))  # type: ignore[misc]
        try:
            cfg = config.current()
            seconds, micros = sync_client(cfg).time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            next_ms = periodic.fire_due(self.app, cfg, now_ms)
            wait_s = min(wait_s, max(0.0, (next_ms - now_ms) / 1000))
        except Exception:
            logger.exception("firing relier's periodic entries failed; retried next tick")
        return wait_s


class Scheduler(_RelierEntries, PersistentScheduler):
    """Celery's persistent scheduler, with ``@rl_task`` entries fired by relier."""


def __getattr__(name: str) -> Any:
    # Built on first use: django-celery-beat is an optional extra.
    if name == "DatabaseScheduler":
        from django_celery_beat.schedulers import DatabaseScheduler as Base

        def enabled_models(self: Any) -> list[Any]:
            # The @rl_task rows are never beat's entries: beat would save each after
            # its tick (last_run_at), moving the row's date_changed, which relier reads
            # as the row's last change.
            return [m for m in Base.enabled_models(self) if not _is_relier(self.app, m.task)]

        def update_from_dict(self: Any, mapping: Any) -> None:
            # beat_schedule's @rl_task entries stay out of the table: relier fires them
            # from the settings, and a copy would be a second entry of the same name.
            keep = {
                n: e
                for n, e in dict(mapping).items()
                if not (isinstance(e, dict) and _is_relier(self.app, e.get("task")))
            }
            Base.update_from_dict(self, keep)

        scheduler = type(
            "DatabaseScheduler",
            (_RelierEntries, Base),
            {
                "__module__": __name__,
                "__doc__": "django-celery-beat's DatabaseScheduler, with ``@rl_task`` rows "
                "fired by relier.",
                "enabled_models": enabled_models,
                "update_from_dict": update_from_dict,
            },
        )
        globals()[name] = scheduler
        return scheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_relier(app: Any, name: Any) -> bool:
    return hasattr(app.tasks.get(name), "relier_spec")
