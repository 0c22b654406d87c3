"""The admin's read-only flow-control pages (docs/flow-control.md, "Seeing it"):
"Flow control" lists the named limits of the settings and every scope in use (slots
held of its capacity, tasks parked, the oldest wait); a scope's page lists who holds
its slots (each task linked to its page, with its worker) and its parked tasks by
key, in turn order, with the rate's next free time.

Reads go through ``readers.limits``, as ``manage.py relier_status`` does. Like the
schedule pages they change nothing and ask for the DLQ admin's view permission
(``pages.read_only``: GET only, never cached, Redis down as the readable 503).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse

from ..readers import limits
from ..readers.render import utc_text
from . import pages
from .overview import duration


def _scope_url(model_admin: ModelAdmin, scope: str) -> str:
    # The scope is any printable text (a task name and a user's key): a query value,
    # escaped by the template, never a path segment.
    return pages.url(model_admin, "limit") + "?" + urlencode({"scope": scope})


def _scope_row(model_admin: ModelAdmin, s: limits.Scope) -> dict[str, Any]:
    return {
        "scope": s,
        "url": _scope_url(model_admin, s.scope),
        "oldest_wait": duration(s.oldest_wait_s),
    }


@pages.read_only("the flow-control limits cannot be shown")
def limit_list(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """The named limits, then every scope in use."""
    found = limits.read()
    context = pages.context(
        request,
        model_admin,
        "Flow control",
        named=limits.named(),
        rows=[_scope_row(model_admin, s) for s in found.scopes],
        now=utc_text(found.at_ms) if found.at_ms else "",
    )
    return pages.render(request, "limits.html", context)


@pages.read_only("the flow-control limit cannot be shown")
def limit_scope(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """One scope: its holders and its parked tasks by key. A scope not in use (its
    tasks are done, so its keys are gone) is a 404 that says so."""
    name = request.GET.get("scope", "")
    found = limits.read()
    scope = found.scope(name)
    if scope is None:
        raise Http404(f"No flow-control scope {name!r} is in use now")

    def linked(task_id: str) -> str:
        return pages.url(model_admin, "task", task_id)

    context = pages.context(
        request,
        model_admin,
        f"Flow control: {scope.scope}",
        scope=scope,
        holders=[{"holder": h, "url": linked(h.task_id)} for h in scope.holders],
        parked=[
            {"line": p, "url": linked(p.oldest_task_id), "wait": duration(p.oldest_wait_s)}
            for p in scope.parked
        ],
        oldest_wait=duration(scope.oldest_wait_s),
        rate_until=None
        if scope.rate_reserved_until_ms is None
        else utc_text(scope.rate_reserved_until_ms),
        rate_next=None if scope.rate_next_free_ms is None else utc_text(scope.rate_next_free_ms),
        now=utc_text(found.at_ms),
        limits_url=pages.url(model_admin, "limits"),
    )
    return pages.render(request, "limit_scope.html", context)
