"""Progress: what a running task reports with ``ctx.set_progress(meta)`` or Celery's
``ctx.update_state(state=..., meta=...)``, for ``AsyncResult(id).state``/``.info``,
a receipt's ``status``/``info``, the admin's task page and the live view.

A progress lives with its task (the task hash's ``progress`` field), written only by
the current incarnation (``progress.lua`` checks the fence), so a zombie cannot
overwrite what its successor reports. It is kept through retries and resurrections (a
new incarnation shows its predecessor's last progress until it reports its own) and
goes with the task hash when the task commits, is dead-lettered or cancelled: from
then on the outcome is what a reader sees, as in Celery, where ``.info`` becomes the
result. Decision: one field holding the state and the meta together, so a reader never
sees one incarnation's state with another's meta.

Eager mode and ``task(...)`` calls have no task hash: their progress is remembered in
this process (:func:`remember`), the most recent tasks only, for the eager receipt and
the result backend to read.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from celery import states

from ..model.envelope import canonical
from ..model.errors import ProgressTooLarge
from ..model.transition import Transition, parse_transition
from . import scripts
from .keys import KeySpace

# The states relier decides from the store itself (queued, retrying, committed,
# dead-lettered, cancelled...): a task reporting one would lie about where it stands.
# STARTED, the state of a running task, may carry meta, as may any state of its own.
RESERVED_STATES = frozenset(
    {states.PENDING, states.RECEIVED, states.RETRY, states.SUCCESS, states.FAILURE,
     states.REVOKED, states.REJECTED, states.IGNORED}
)  # fmt: skip
DEFAULT_STATE = states.STARTED
_MAX_STATE_CHARS = 64
# Eager runs and task(...) calls remembered at most, oldest forgotten first: a bound,
# since nothing tells this module when a direct call's reader is done with it.
_REMEMBERED = 1024


@dataclass(frozen=True, slots=True)
class Progress:
    """A task's last reported progress: a Celery state name and its JSON meta."""

    state: str
    meta: Any

    @property
    def meta_text(self) -> str:
        """The meta as compact JSON, for a page or a listing to show."""
        return canonical(self.meta)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "meta": self.meta}


def checked_state(state: str | None) -> str:
    """The state to store for ``state`` (None: ``STARTED``).

    Raises:
        ValueError: a state relier decides itself, an empty or overlong name.
    """
    if state is None:
        return str(DEFAULT_STATE)
    if not isinstance(state, str) or not state or len(state) > _MAX_STATE_CHARS:
        raise ValueError(
            f"a progress state is a non-empty name of at most {_MAX_STATE_CHARS} "
            f"characters, such as 'PROGRESS'; got {state!r}"
        )
    if state in RESERVED_STATES:
        raise ValueError(
            f"state {state!r} is relier's to set (from queued, retried, committed, "
            "dead-lettered or cancelled); report progress under a state of your own "
            "naming, such as 'PROGRESS', or STARTED: return to succeed, raise to fail"
        )
    return state


def record(state: str | None, meta: Any, max_bytes: int) -> str:
    """The record to store: canonical JSON of the state and the meta.

    Raises:
        ValueError: see :func:`checked_state`.
        TypeError: ``meta`` is not JSON-serialisable.
        ProgressTooLarge: the record is larger than ``max_bytes``.
    """
    name = checked_state(state)
    try:
        body = canonical({"state": name, "meta": meta})
    except (TypeError, ValueError) as exc:
        raise TypeError(f"progress meta must be JSON-serialisable: {exc}") from exc
    size = len(body.encode())
    if size > max_bytes:
        raise ProgressTooLarge(size, max_bytes)
    return body


def load(stored: str | None) -> Progress | None:
    """The progress a record holds (None for no record, or one that is not a record)."""
    if not stored:
        return None
    try:
        found = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(found, dict) or not isinstance(found.get("state"), str):
        return None
    return Progress(found["state"], found.get("meta"))


def save(keys: KeySpace, task_id: str, fence: int, stored: str) -> scripts.ScriptCall[Transition]:
    """progress.lua: store the record if ``fence`` is still the task's running fence."""
    return scripts.ScriptCall(
        scripts.PROGRESS, keys.for_progress(task_id), [fence, stored], parse_transition
    )


_lock = threading.Lock()
_inline: OrderedDict[str, str] = OrderedDict()


def remember(task_id: str, stored: str) -> None:
    """Keep the progress of a task run in this process (eager mode, ``task(...)``)."""
    with _lock:
        _inline[task_id] = stored
        _inline.move_to_end(task_id)
        while len(_inline) > _REMEMBERED:
            _inline.popitem(last=False)


def recall(task_id: str) -> Progress | None:
    """The progress a task run in this process reported last, if it is remembered."""
    with _lock:
        stored = _inline.get(task_id)
    return load(stored)


def forget(task_id: str | None = None) -> None:
    """Drop one task's remembered progress (its run ended), or every one (None)."""
    with _lock:
        if task_id is None:
            _inline.clear()
        else:
            _inline.pop(task_id, None)
