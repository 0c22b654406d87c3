"""The admin's read-only schedule pages: "Scheduled tasks" (what waits for its due
time, earliest first, by pages) and "Periodic entries" (each ``beat_schedule`` entry
relier fires: schedule, last tick and its outcome, next tick).

Reads go through ``readers.scheduled``, as ``manage.py relier_scheduled`` does.
The pages change nothing, so they ask for the DLQ admin's view permission
(``relier_django.view_dlq``) rather than a permission of their own, which would need a
new model and migration. ``admin.DeadLetterAdmin.get_urls`` binds each view to its
``model_admin`` and wraps it in ``admin_site.admin_view`` (staff login); Redis down is
``pages``' readable 503, as on every Relier page.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse

from ..readers import scheduled
from ..readers.render import utc_text
from . import pages

PAGE_SIZE = 50


def _relative(delta_ms: int) -> str:
    """``in 5 min`` / ``late by 2 s``: a due time against now, coarse."""
    ahead, ms = delta_ms >= 0, abs(delta_ms)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if ms >= size:
            amount = f"{ms // size} {unit}"
            break
    else:
        amount = f"{ms // 1000} s"
    return f"in {amount}" if ahead else f"late by {amount}"


def _cursor(request: HttpRequest) -> scheduled.Cursor | None:
    text = request.GET.get("cursor")
    if not text:
        return None
    try:
        return scheduled.Cursor.parse(text)
    except ValueError:
        messages.error(request, "That page link is not valid; showing the first page.")
        return None


def _query(**params: str | None) -> str:
    return "?" + urlencode({k: v for k, v in params.items() if v})


@pages.read_only("what is scheduled cannot be shown")
def scheduled_list(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """The tasks waiting for their due time, earliest first, PAGE_SIZE a page."""
    task = request.GET.get("task", "").strip() or None
    cursor = _cursor(request)
    page = scheduled.page(cursor, PAGE_SIZE, task)
    rows = [
        {
            "task": t,
            "due": utc_text(t.due_ms),
            "relative": _relative(t.due_ms - page.now_ms),
            "late": t.due_ms < page.now_ms,
            "expires": None if t.expires_ms is None else utc_text(t.expires_ms),
            "arguments": t.arguments_repr(),
        }
        for t in page.tasks
    ]
    nxt = None if page.next_cursor is None else str(page.next_cursor)
    context = pages.context(
        request,
        model_admin,
        "Scheduled tasks",
        rows=rows,
        total=page.total,
        now=utc_text(page.now_ms),
        task=task or "",
        first_page=_query(task=task) if cursor is not None else None,
        next_page=_query(task=task, cursor=nxt) if nxt else None,
    )
    return pages.render(request, "scheduled.html", context)


@pages.read_only("the periodic entries cannot be shown")
def periodic_list(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """Each ``beat_schedule`` entry relier fires, and the ones it does not, with why."""
    view = scheduled.periodic()
    rows = [
        {
            "entry": e,
            "last": None if e.last_tick_ms is None else utc_text(e.last_tick_ms),
            "next": utc_text(e.next_tick_ms),
            "next_relative": _relative(e.next_tick_ms - view.now_ms),
        }
        for e in view.entries
    ]
    context = pages.context(
        request,
        model_admin,
        "Periodic entries",
        rows=rows,
        not_fired=view.not_fired,
        now=utc_text(view.now_ms),
    )
    return pages.render(request, "periodic.html", context)
