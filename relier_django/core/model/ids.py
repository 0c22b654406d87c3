"""The rule a caller-chosen id follows: a task id given to ``push``/``apply_async``, a
chain step's or a chord callback's frozen id, a group's id, the id of a replayed
envelope. Checked before anything is stored (G6). Pure; no I/O.

An id is written verbatim into log lines (``task_id=...``), Redis keys, admin URLs and
pages, and the outbox's and inbox's key columns. A newline in it forges a log line and
makes an admin page unreachable; a control or format character (a NUL, a bidi
override) hides what an operator reads; an unbounded one does not fit a column. So an
id is short, printable and one word.
"""

from __future__ import annotations

from .errors import InvalidTaskId

MAX_ID_CHARS = 64
"""The longest id a caller may choose, in characters. The outbox's ``task_id`` column
holds 64 (``relier_django.models.OutboxEntry``), and the inbox keys a unit of work as
``<task id>:<unit name>`` in 200, which leaves a unit name 135. Celery's own ids are
36-character uuids, relier's 32 hex digits."""

RULE = (
    f"A task id is 1 to {MAX_ID_CHARS} printable characters with no whitespace or control "
    "characters: it is written into log lines, Redis keys, admin URLs and database "
    "columns"
)


def check_id(value: object, what: str = "task_id") -> str:
    """``value`` when it is a valid caller-chosen id.

    Args:
        value: the id as given.
        what: how the caller named it, for the message (``task_id``, ``group_id``,
            ``chain step 'shop.ship' task_id``).

    Returns:
        ``value``, unchanged.

    Raises:
        TypeError: ``value`` is not a ``str``.
        InvalidTaskId: (a ``ValueError``) it breaks the rule; the message names the
            rule, the id (its ``repr``, so a newline shows as ``\\n``) and what is wrong.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} {value!r}")
    problem = _problem(value)
    if problem is not None:
        raise InvalidTaskId(what, value, problem, RULE)
    return value


def _problem(value: str) -> str | None:
    if not value:
        return "it is empty"
    if len(value) > MAX_ID_CHARS:
        return f"it has {len(value)} characters"
    # isprintable() is False for control, format (bidi overrides, zero-width), line and
    # paragraph separators, surrogates (no UTF-8 form) and unassigned code points, and
    # True for the ASCII space, which isspace() catches with the other blanks.
    for index, char in enumerate(value):
        if not char.isprintable() or char.isspace():
            return f"it holds {char!r} at index {index}"
    return None
