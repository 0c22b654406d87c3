"""Celery's result backend over relier's store, and ``result(task_id)``.

``CELERY_RESULT_BACKEND = "relier_django.results:RelierBackend"`` makes
``AsyncResult(task_id)`` (``.state``, ``.result``, ``.get(timeout=)``,
``.traceback``), in any process, read what relier's store says of an ``@rl_task``:

| relier's store | Celery state | ``.result`` |
|---|---|---|
| a committed result | ``SUCCESS`` | the result |
| in the DLQ (its result, or its entry once the result expired) | ``FAILURE`` | ``TaskFailed`` |
| an incarnation running that reported progress | its state (``PROGRESS``...) | its meta |
| an incarnation running | ``STARTED`` | ``{"hostname", "attempt", "fence"}`` |
| queued after a failed attempt (a retry) | ``RETRY`` | None |
| queued, or handed off / leased for resurrection | ``PENDING`` | None |
| nothing under that id | the fallback's answer, else ``PENDING`` | |

Nothing is written for relier's tasks: commit.lua and dead_letter.lua already wrote
the outcome, and ``RelierTask`` ignores results. Every write Celery makes (your other
tasks' results, groups, chords) and every read of an id relier does not know go to
``RELIER["RESULT_BACKEND_FALLBACK"]``, any Celery backend URL. Without one, writes
are dropped with a WARNING once per task name, unknown ids read ``PENDING``, and
groups and chords refuse to start, naming the setting. Decision: a fallback rather
than storing other tasks' results in relier's store, so relier's keys stay the ones
``keys.py`` lists, and a shop keeps the backend (and the expiry) it already runs.
``get()`` polls (this backend and its fallback), as Celery's database backends do.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from celery.app import backends
from celery.backends.base import BaseBackend
from django.core.exceptions import ImproperlyConfigured

from . import conf
from .core.model import config, links
from .core.model.redaction import redact
from .core.store import chords, progress
from .core.store.connection import sync_client
from .core.store.keys import KeySpace
from .core.store.receipt import TaskStatus, aresult, read_status, result

__all__ = ["RelierBackend", "aresult", "result"]

logger = logging.getLogger("relier_django.results")

_SETTING = 'RELIER["RESULT_BACKEND_FALLBACK"]'


class RelierBackend(BaseBackend):
    """Celery's result backend for a project using ``@rl_task``: see the module docstring.

    Args:
        app: the Celery app (Celery passes it).
        url: ignored (Celery passes the backend's name).
    """

    supports_native_join = False  # ResultSet.join() polls each result instead

    def __init__(self, app: Any, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, url=url, **kwargs)
        self._fallback: tuple[str, BaseBackend] | None = None
        self._lock = threading.Lock()
        self._dropped: set[str] = set()

    # -- the fallback --------------------------------------------------------------
    @property
    def fallback(self) -> BaseBackend | None:
        """The backend of ``RESULT_BACKEND_FALLBACK``, built once per URL; None when unset."""
        url = conf.get_django_settings().result_backend_fallback
        if not url:
            return None
        with self._lock:
            if self._fallback is None or self._fallback[0] != url:
                cls, found = backends.by_url(url, self.app.loader)
                if issubclass(cls, RelierBackend):
                    raise ImproperlyConfigured(
                        f"{_SETTING} names RelierBackend itself; give another Celery "
                        "result backend, e.g. redis://host:6379/1"
                    )
                self._fallback = (url, cls(app=self.app, url=found))
            return self._fallback[1]

    def _needs_fallback(self, what: str) -> BaseBackend:
        fallback = self.fallback
        if fallback is None:
            raise NotImplementedError(
                f"{what} needs a result backend for Celery's own records: set {_SETTING} "
                f"to one (e.g. redis://host:6379/1); see {links.doc('results.md')}"
            )
        return fallback

    # -- reads -------------------------------------------------------------------------
    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        reported = progress.recall(task_id)  # a task running eagerly in this process
        if reported is not None:
            return _meta(TaskStatus(task_id, reported.state, reported.meta))
        status = read_status(config.current(), task_id)
        if status.known:
            return _meta(status)
        fallback = self.fallback
        if fallback is not None:
            return dict(fallback.get_task_meta(task_id, cache=False))
        return _meta(status)

    # -- writes, all the fallback's ---------------------------------------------------
    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        fallback = self.fallback
        if fallback is not None:
            return fallback.store_result(
                task_id, result, state, traceback=traceback, request=request, **kwargs
            )
        name = str(getattr(request, "task", None) or "-")
        if name not in self._dropped:  # once per task name: never silent, never a flood
            self._dropped.add(name)
            logger.warning(
                "result dropped task=%s task_id=%s state=%s: RelierBackend keeps only "
                "@rl_task outcomes; set %s for other tasks' results",
                name, task_id, state, _SETTING,
            )  # fmt: skip
        return result

    def _forget(self, task_id: str) -> None:
        # relier's outcomes expire with RESULT_TTL_S; only the fallback's can be forgotten.
        if self.fallback is not None:
            self.fallback.forget(task_id)

    def _save_group(self, group_id: str, result: Any) -> Any:
        return self._needs_fallback("a group result").save_group(group_id, result)

    def _restore_group(self, group_id: str) -> Any:
        fallback = self.fallback
        return fallback.get_group_meta(group_id, cache=False) if fallback is not None else None

    def _delete_group(self, group_id: str) -> Any:
        return self._needs_fallback("a group result").delete_group(group_id)

    # -- chords, cleanup, the broker hook: the fallback's ----------------------------
    def ensure_chords_allowed(self) -> None:
        pass  # a chord of @rl_task signatures is relier's; apply_chord decides for the rest

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> Any:
        # An @rl_task callback: relier's store counts the header and creates the callback
        # (docs/workflows.md); Celery's records are not involved.
        if getattr(getattr(body, "type", None), "relier_spec", None) is not None:
            return None
        return self._needs_fallback("a chord").apply_chord(header_result_args, body, **kwargs)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        if self.fallback is not None:
            self.fallback.on_chord_part_return(request, state, result, **kwargs)

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        # Celery says the header's size before it pushes the last member: relier's
        # chord state needs it to know which member's commit completes the header.
        cfg = conf.get_config()
        chords.set_size(sync_client(cfg), KeySpace.of(cfg), group_id, chord_size)
        if self.fallback is not None:
            self.fallback.set_chord_size(group_id, chord_size)

    def add_to_chord(self, chord_id: str, result: Any) -> Any:
        return self._needs_fallback("a chord").add_to_chord(chord_id, result)

    def on_task_call(self, producer: Any, task_id: str) -> Any:
        return self.fallback.on_task_call(producer, task_id) if self.fallback is not None else {}

    def cleanup(self) -> None:
        if self.fallback is not None:
            self.fallback.cleanup()

    def process_cleanup(self) -> None:
        if self.fallback is not None:
            self.fallback.process_cleanup()

    @property
    def supports_autoexpire(self) -> bool:
        # relier's results carry RESULT_TTL_S; a fallback may need Celery's daily cleanup.
        return self.fallback is None or bool(self.fallback.supports_autoexpire)

    def as_uri(self, include_password: bool = False) -> str:
        url = conf.get_django_settings().result_backend_fallback
        if not url:
            return "relier_django.results:RelierBackend"
        shown = url if include_password else redact(url)
        return f"relier_django.results:RelierBackend (fallback {shown})"


def _meta(status: TaskStatus) -> dict[str, Any]:
    """Celery's task meta for a relier status."""
    done = (
        datetime.fromtimestamp(status.done_ms / 1000, UTC) if status.done_ms is not None else None
    )
    return {
        "task_id": status.task_id,
        "status": status.state,
        "result": status.result,
        "traceback": status.traceback,
        "children": [],
        "date_done": done,
    }
