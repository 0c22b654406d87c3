"""The DLQ admin pages: the list, an entry, and release/delete behind a confirm page.

No DLQ logic lives here: reads and writes go through ``relier_django.dlq``, which is
also what ``manage.py relier_dlq`` uses. What these views add is the admin's side of
it (docs/dlq-admin.md): a permission check on every page, POST-only mutations that
only happen on a second, confirmed POST, a release or delete pinned to the failure the
operator saw, and a readable 503 page, never a traceback, when Redis is down.

``admin.DeadLetterAdmin.get_urls`` binds each view to its ``model_admin`` and wraps
it in ``admin_site.admin_view`` (staff login and CSRF).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from kombu.exceptions import OperationalError

from .. import dlq
from ..readers.render import history_table, plural, utc
from . import pages

PAGE_SIZE = 50
MAX_SELECTED = 200  # entries one action may name: four full pages
ACTIONS = ("release", "delete")
NO_TASK = "(no task name)"  # a message that could not be tied to a task
_LOST = "the dead-letter queue cannot be shown or changed"


@dataclass(frozen=True, slots=True)
class Pin:
    """A selected entry and the failure (fence) the operator saw, as the forms carry it:
    ``<entry id>@<fence>``, the fence empty for a message that was never a task."""

    entry_id: str
    fence: int | None

    def __str__(self) -> str:
        return f"{self.entry_id}@{'' if self.fence is None else self.fence}"

    @classmethod
    def of(cls, summary: dlq.Summary) -> Pin:
        return cls(summary.id, summary.fence)

    @classmethod
    def parse(cls, text: str) -> Pin:
        entry_id, sep, fence = text.rpartition("@")  # ids may hold '@'; fences never
        if not (sep and entry_id and (fence == "" or fence.isdigit())):
            raise ValueError(f"not an entry selection: {text!r}")
        return cls(entry_id, int(fence) if fence else None)


@dataclass(frozen=True, slots=True)
class Choice:
    """One line of a sidebar filter."""

    label: str
    count: int | None
    query: str
    selected: bool


def _query(**params: str | None) -> str:
    # None drops a parameter; "" is kept (task="" selects messages with no task name).
    return "?" + urlencode({k: v for k, v in params.items() if v is not None})


def _require(allowed: bool) -> None:
    if not allowed:
        raise PermissionDenied


def _search(
    model_admin: ModelAdmin, store: dlq.DeadLetterStore, counts: dlq.Counts, q: str
) -> HttpResponse | list[str]:
    """An exact entry id opens it; else the task names containing ``q`` (one: filtered,
    ``q`` kept for the search box)."""
    if store.get(q) is not None:
        return HttpResponseRedirect(pages.url(model_admin, "detail", q))
    names = sorted(t for t in counts.by_task if q.casefold() in t.casefold())
    if len(names) == 1:
        return HttpResponseRedirect(
            pages.url(model_admin, "changelist") + _query(task=names[0], q=q)
        )
    return names


def _choices(
    counted: Mapping[str, int],
    chosen: str | None,
    query: Callable[[str | None], str],
    label: Callable[[str], str] = str,
) -> list[Choice]:
    names = sorted({*counted, *([] if chosen is None else [chosen])})
    return [Choice("All", None, query(None), chosen is None)] + [
        Choice(label(n), counted.get(n, 0), query(n), n == chosen) for n in names
    ]


def _facets(
    counts: dlq.Counts, task: str | None, reason: str | None, q: str | None
) -> dict[str, list[Choice]]:
    """The sidebar: tasks counted within the chosen reason, and reasons within the task.
    A reason keeps the search ``q``; a task replaces it (a search chooses a task)."""
    pairs = counts.by_reason_and_task.items()
    by_task = counts.by_task if reason is None else {t: n for (r, t), n in pairs if r == reason}
    by_reason = counts.by_reason if task is None else {r: n for (r, t), n in pairs if t == task}
    return {
        "task": _choices(
            by_task, task, lambda t: _query(task=t, reason=reason), lambda t: t or NO_TASK
        ),
        "reason": _choices(by_reason, reason, lambda r: _query(task=task, reason=r, q=q)),
    }


def _cursor(request: HttpRequest) -> dlq.Cursor | None:
    text = request.GET.get("cursor")
    if not text:
        return None
    try:
        return dlq.Cursor.parse(text)
    except ValueError:
        messages.error(request, "That page link is not valid; showing the first page.")
        return None


@never_cache
@require_GET
@pages.guarded(_LOST)
def changelist(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """The entries, newest failure first, PAGE_SIZE a page, filtered by task and reason."""
    _require(model_admin.has_view_permission(request))
    store = dlq.store()
    counts = store.counts()
    q = request.GET.get("q", "").strip()
    task = request.GET.get("task")  # present but empty: messages with no task name
    # With a task chosen, the query was searched already (it chose the task): it is only
    # kept, for the search box and the links, as the admin's changelist keeps it.
    searched = bool(q) and task is None
    task_matches = _search(model_admin, store, counts, q) if searched else []
    if isinstance(task_matches, HttpResponse):
        return task_matches
    reason = request.GET.get("reason") or None
    query = dlq.Query(task=task, reason=reason)
    cursor = _cursor(request)
    page = store.page(query, cursor, PAGE_SIZE)
    rows = [
        {"summary": s, "failed_at": utc(s.failed_at_ms), "pin": str(Pin.of(s))}
        for s in page.entries
    ]
    next_cursor = None if page.next_cursor is None else str(page.next_cursor)
    kept = q or None
    context = pages.context(
        request,
        model_admin,
        "Dead-letter queue",
        q=q,
        searched=searched,
        task=task,
        reason=reason,
        filtered=task is not None or reason is not None,
        task_matches=[{"name": t, "query": _query(task=t)} for t in task_matches],
        counts=counts,
        matching=counts.matching(query),
        facets=_facets(counts, task, reason, kept),
        rows=rows,
        first_page=_query(task=task, reason=reason, q=kept) if cursor is not None else None,
        next_page=(
            _query(task=task, reason=reason, q=kept, cursor=next_cursor) if next_cursor else None
        ),
        no_task=NO_TASK,
    )
    return pages.render(request, "list.html", context)


# --- one entry --------------------------------------------------------------------------


@never_cache
@require_GET
@pages.guarded(_LOST)
def detail(request: HttpRequest, model_admin: ModelAdmin, entry_id: str) -> HttpResponse:
    """Everything an entry holds: summary, error, traceback, envelope (or raw), history."""
    _require(model_admin.has_view_permission(request))
    entry = dlq.store().get(entry_id)
    if entry is None:
        messages.warning(
            request,
            f"There is no entry {entry_id} in the dead-letter queue: it was released or "
            "deleted meanwhile, or never existed.",
        )
        return HttpResponseRedirect(pages.url(model_admin, "changelist"))
    envelope = entry.envelope
    context = pages.context(
        request,
        model_admin,
        f"Entry {entry.id}",
        entry=entry,
        summary=entry.summary,
        data=entry.data,
        failed_at=utc(entry.summary.failed_at_ms),
        first_failed_at=utc(entry.summary.first_failed_at_ms),
        envelope_json=None if envelope is None else json.dumps(envelope, indent=2),
        history=history_table(entry.history),
        pin=str(Pin.of(entry.summary)),
    )
    return pages.render(request, "detail.html", context)


# --- release and delete -----------------------------------------------------------------


def _pins(values: Iterable[str]) -> list[Pin]:
    """Parse and de-duplicate the selection, in order. Raises ValueError."""
    pins = list(dict.fromkeys(Pin.parse(v) for v in values))
    if len(pins) > MAX_SELECTED:
        raise ValueError(f"at most {MAX_SELECTED} entries at a time, got {len(pins)}")
    return pins


def _back(model_admin: ModelAdmin, form: Mapping[str, str]) -> str:
    """The list, with the filters and search the action was started from."""
    filters = {k: form[k] for k in ("task", "reason", "q") if k in form}
    return pages.url(model_admin, "changelist") + (_query(**filters) if filters else "")


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:10])
    return shown if len(ids) <= 10 else f"{shown} and {len(ids) - 10} more"


def _preview(action: str, pin: Pin, entry: dlq.Entry | None) -> str:
    """What the confirmed action will do to one entry, as far as can be seen now (the
    action itself re-checks each entry atomically)."""
    if entry is None:
        return "No longer in the dead-letter queue: skipped."
    if entry.fence != pin.fence:
        return f"Failed again since (now at fence {entry.fence}): left alone."
    if action == "release" and entry.envelope is None:
        return "Holds no envelope (a malformed message): cannot be released."
    return "Will be released." if action == "release" else "Will be deleted."


def _confirm(
    request: HttpRequest, model_admin: ModelAdmin, action: str, pins: list[Pin]
) -> HttpResponse:
    store = dlq.store()
    rows = []
    for pin in pins:
        entry = store.get(pin.entry_id)
        summary = None if entry is None else entry.summary
        outcome = _preview(action, pin, entry)
        rows.append({"pin": pin, "summary": summary, "outcome": outcome})
    context = pages.context(
        request,
        model_admin,
        f"{action.capitalize()} {plural(len(pins))}?",
        action=action,
        rows=rows,
        task=request.POST.get("task"),
        reason=request.POST.get("reason"),
        q=request.POST.get("q"),
        back_url=_back(model_admin, request.POST),
    )
    return pages.render(request, "confirm.html", context)


def _release(request: HttpRequest, pins: Sequence[Pin]) -> None:
    released: list[str] = []
    try:
        for pin in pins:
            try:
                dlq.release_entry(pin.entry_id, expected_fence=pin.fence)
            except dlq.EntryNotReleasable as exc:
                messages.error(request, f"Not released: {exc}")
            except OperationalError as exc:
                # The broker refused: core.release put this entry back; stop here.
                messages.error(
                    request,
                    f"The Celery broker cannot be reached ({exc}); {pin.entry_id} and the "
                    "entries after it stay in the dead-letter queue.",
                )
                return
            else:
                released.append(pin.entry_id)
    finally:  # a Redis error mid-way: still say which were released before it
        if released:
            messages.success(
                request,
                f"Released {plural(len(released))}: {_ids(released)}. "
                "Each task runs again as a new incarnation.",
            )


def _delete(request: HttpRequest, pins: Sequence[Pin]) -> None:
    ids = [p.entry_id for p in pins]
    deleted = dlq.store().delete(ids, [p.fence for p in pins])
    if deleted:
        messages.success(request, f"Deleted {plural(len(deleted))}: {_ids(deleted)}.")
    gone = set(deleted)
    kept = [i for i in ids if i not in gone]  # dlq_delete.lua said no
    if kept:
        messages.warning(request, f"Not deleted, already gone or failed again since: {_ids(kept)}.")


@never_cache
@require_POST
@pages.guarded(_LOST)
def act(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    """Release or delete the selected entries: the first POST shows what will happen,
    only a second one with ``confirm=yes`` does it."""
    _require(model_admin.has_manage_permission(request))
    back = _back(model_admin, request.POST)
    action = request.POST.get("action", "")
    if action not in ACTIONS:
        messages.warning(request, "Choose an action: release or delete.")
        return HttpResponseRedirect(back)
    try:
        pins = _pins(request.POST.getlist("selected"))
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    if not pins:
        messages.warning(request, "Select at least one entry for the action.")
        return HttpResponseRedirect(back)
    if request.POST.get("confirm") != "yes":
        return _confirm(request, model_admin, action, pins)
    if action == "release":
        _release(request, pins)
    else:
        _delete(request, pins)
    return HttpResponseRedirect(back)
