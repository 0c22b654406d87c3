"""The admin's task page: one in-flight task and its history (docs/admin-overview.md).

The overview lists the oldest tasks in flight; each id links here. The page shows what
the task hash holds (state as the live view names it, fence, attempt, worker, times)
and its incarnation history, as the DLQ entry page shows an entry's. Once the task is
no longer in flight the page says where it went: a dead-lettered task's id is its DLQ
entry's, so it redirects there; a finished one names its outcome's status while the
outcome is kept (``RESULT_TTL_S``), never its result; any other id is a 404 inside the
admin's look.

Read-only (``pages.read_only``), as the overview is. Task ids are
caller-chosen text: they reach the page only through the autoescaping template.
"""

from __future__ import annotations

from typing import Any

from celery import states
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from .. import conf, dlq
from ..core.model.errors import TaskFailed
from ..core.observe.task import TaskView
from ..core.store.receipt import TaskStatus
from ..readers import tasks
from ..readers.render import history_table, utc_text
from . import pages
from .overview import duration

# A finished task's status as the page words it.
_FINISHED = {
    states.SUCCESS: "committed",
    states.FAILURE: "dead-lettered",
    states.REVOKED: "cancelled",
}


def _time(ms: int | None) -> str:
    return "-" if ms is None else f"{utc_text(ms)} UTC"


def facts(task: TaskView) -> list[tuple[str, str, str]]:
    """The task's fields as (id, label, text) rows, times in UTC (Redis clock)."""
    started = "Started" if task.state == "running" else "Last incarnation started"
    reported = task.progress
    return [
        ("state", "State", task.state),
        *([("progress", "Progress", f"{reported.state} {reported.meta_text}")] if reported else []),
        ("name", "Task", task.name),
        ("queue", "Queue", task.queue or "(default)"),
        ("fence", "Fence", str(task.fence)),
        ("attempt", "Attempt", str(task.attempt)),
        ("resurrections", "Resurrections", str(task.resurrections)),
        ("worker", "Worker", task.worker or "-"),
        ("created", "Created", _time(task.created_ms)),
        ("started", started, _time(task.started_ms)),
        ("due", "Due", _time(task.due_ms)),
        ("expires", "Expires", _time(task.expires_ms)),
    ]


def finished(status: TaskStatus) -> dict[str, Any] | None:
    """What the page says of a task that is no longer in flight, from its kept outcome;
    None when no outcome is kept (never pushed, or it expired)."""
    word = _FINISHED.get(status.state) if status.known else None
    if word is None:
        return None
    failure = status.result if isinstance(status.result, TaskFailed) else None
    return {
        "state": status.state,
        "word": word,
        "reason": None if failure is None or status.state != states.FAILURE else failure.reason,
    }


@pages.read_only("this task cannot be shown")
def task(request: HttpRequest, model_admin: ModelAdmin, task_id: str) -> HttpResponse:
    """One task: in flight, its page; dead-lettered, its DLQ entry; finished, its
    outcome's status; else 404."""
    found = tasks.unfinished(task_id)
    title = f"Task {task_id}"
    if found is not None:
        context = pages.context(
            request,
            model_admin,
            title,
            task_id=task_id,
            task=found,
            facts=facts(found),
            history=history_table(found.history),
        )
        return pages.render(request, "task.html", context)
    if dlq.store().get(task_id) is not None:
        return HttpResponseRedirect(pages.url(model_admin, "detail", task_id))
    done = finished(tasks.outcome(task_id))
    context = pages.context(
        request,
        model_admin,
        title,
        task_id=task_id,
        finished=done,
        result_ttl=duration(conf.get_config().result_ttl_s),
    )
    return pages.render(request, "task.html", context, status=200 if done else 404)
