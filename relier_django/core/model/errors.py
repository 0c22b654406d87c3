"""Every exception relier_django raises derives from :class:`RelierError`."""

from __future__ import annotations

from collections.abc import Sequence

from kombu.exceptions import OperationalError


class RelierError(Exception):
    """Root of relier_django's exceptions."""


class ConfigError(RelierError, ValueError):
    """A setting has a value that cannot work. The Django layer re-raises it as
    ``ImproperlyConfigured``.

    Attributes:
        by_field: one ``(field, text)`` per bad value, when the error comes from
            ``Config`` itself: the message is each field name followed by its text, so
            the Django layer can name the setting (``settings.RELIER['X']`` or
            ``RELIER_X``) in place of the field.
    """

    def __init__(self, message: str, by_field: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.by_field: tuple[tuple[str, str], ...] = tuple(by_field)


class EnvelopeError(RelierError):
    """A message that is not a valid envelope. ``raw`` keeps the bytes as received, so
    the DLQ can store them untouched; ``reason`` is a DLQ reason code."""

    def __init__(self, message: str, *, raw: object, reason: str) -> None:
        super().__init__(message)
        self.raw = raw
        self.reason = reason


class TaskFailed(RelierError):
    """The task will not produce a result: it is in the dead-letter queue.

    Attributes:
        task_id: the task's id.
        reason: the DLQ reason code (``exception``, ``retries_exhausted``, ...).
        error: ``"ExceptionType: message"`` of the last failure, when there was one.
    """

    def __init__(self, task_id: str, reason: str, error: str | None = None) -> None:
        detail = f": {error}" if error else ""
        super().__init__(f"task {task_id} is in the dead-letter queue ({reason}){detail}")
        self.task_id = task_id
        self.reason = reason
        self.error = error

    def __reduce__(self) -> tuple[type[TaskFailed], tuple[str, str, str | None]]:
        # Celery pickles a task's exception from the pool process to the worker and
        # to task_failure handlers; without this it would arrive as a bare RelierError.
        return type(self), (self.task_id, self.reason, self.error)


class TaskCancelled(TaskFailed):
    """The task was cancelled (``relier_django.cancel``) and will not produce a result.
    A ``TaskFailed`` with reason ``cancelled``, so code that handles failures handles it;
    it is not in the dead-letter queue."""

    def __init__(self, task_id: str) -> None:
        RelierError.__init__(self, f"task {task_id} was cancelled")
        self.task_id, self.reason, self.error = task_id, "cancelled", None

    def __reduce__(self) -> tuple[type[TaskCancelled], tuple[str]]:  # type: ignore[override]
        return type(self), (self.task_id,)


class TaskSuperseded(TaskCancelled):
    """A debounced task (``push_with(debounce_s=...)``) was superseded, before it was
    dispatched, by a later push of its debounce key within the window: it never ran,
    and ``superseded_by`` (the later task's id) runs in its place. A ``TaskCancelled``
    with reason ``superseded`` (Celery's state ``REVOKED``); it is not in the DLQ."""

    def __init__(self, task_id: str, superseded_by: str) -> None:
        RelierError.__init__(self, f"task {task_id} was superseded by task {superseded_by}")
        self.task_id, self.reason, self.error = task_id, "superseded", None
        self.superseded_by = superseded_by

    def __reduce__(self) -> tuple[type[TaskSuperseded], tuple[str, str]]:  # type: ignore[override]
        return type(self), (self.task_id, self.superseded_by)


class EntryNotReleasable(RelierError):
    """A DLQ entry cannot be released: unknown id, already released, no envelope
    (a malformed message), or its task id is live again. ``reason`` says which."""

    def __init__(self, entry_id: str, reason: str) -> None:
        super().__init__(f"DLQ entry {entry_id}: {reason}")
        self.entry_id = entry_id
        self.reason = reason


class DuplicateTaskId(RelierError):
    """``push(task_id=...)`` reused the id of a task that still exists, or of a DLQ entry."""


class AdmissionRejected(RelierError):
    """``push()`` refused by admission control: nothing was stored or sent.

    Attributes:
        task: the task's name.
        retry_after_s: seconds until the full window resets (the live TTL of its counter).
    """

    def __init__(self, task: str, retry_after_s: float) -> None:
        super().__init__(
            f"{task}: too many pushes, admission refused; retry after {retry_after_s:.3f} s"
        )
        self.task = task
        self.retry_after_s = retry_after_s


class CheckpointTooLarge(RelierError):
    """``ctx.set_partial(state)``: the state's JSON is larger than CHECKPOINT_MAX_BYTES
    and no CHECKPOINT_DIR is configured to hold it in a file."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"checkpoint of {size} bytes exceeds CHECKPOINT_MAX_BYTES ({limit}); store less, "
            "raise the limit, or set CHECKPOINT_DIR so large checkpoints go to files"
        )
        self.size = size
        self.limit = limit


class ProgressTooLarge(RelierError, ValueError):
    """``ctx.set_progress(meta)`` / ``ctx.update_state(meta=...)``: the progress's JSON
    is larger than CHECKPOINT_MAX_BYTES (progress is read by polling; keep it small)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"progress of {size} bytes exceeds CHECKPOINT_MAX_BYTES ({limit}); report a "
            "summary (counts, a percentage, a short message), not the data itself"
        )
        self.size = size
        self.limit = limit


class ArgumentsTooLarge(RelierError, ValueError):
    """A push whose encoded task is larger than ARGUMENTS_MAX_BYTES: refused before
    anything is stored. Redis keeps every task's envelope until its result expires, so
    a large argument costs memory on every server that holds it, for a day.

    Attributes:
        size: the encoded task's size in bytes.
        limit: ARGUMENTS_MAX_BYTES.
        largest: the largest argument's name (``"args[0]"`` for a positional one).
    """

    def __init__(self, task: str, size: int, limit: int, largest: str, largest_size: int) -> None:
        super().__init__(
            f"{task}: the task's arguments take {size} bytes encoded, above "
            f"ARGUMENTS_MAX_BYTES ({limit}); the largest is {largest} ({largest_size} bytes). "
            "Store the data elsewhere (a model row, a file, object storage) and pass its "
            "id, or raise settings.RELIER['ARGUMENTS_MAX_BYTES']"
        )
        self.size, self.limit, self.largest = size, limit, largest


class InvalidTaskId(RelierError, ValueError):
    """A task id chosen by the caller (``apply_async(task_id=...)``, a signature's frozen
    id, a group's id, a replayed envelope's id) that breaks the rule of
    ``model.ids``: refused before anything is stored.

    Attributes:
        task_id: the id as given.
        problem: what is wrong with it, in words ("it holds '\\n' at index 3").
    """

    def __init__(self, what: str, task_id: str, problem: str, rule: str) -> None:
        super().__init__(
            f"{what}={task_id!r} is not a valid task id: {problem}. {rule}. Leave it out "
            "and relier draws one, or pass e.g. uuid.uuid4().hex"
        )
        self.task_id, self.problem = task_id, problem


class PushFailed(RelierError, OperationalError):
    """A push sent at once (no transaction open, or ``on_commit=False``) could not reach
    relier's Redis or Celery's broker, after the client's retries. Nothing was stored,
    so nothing will run: retry the push, or answer the request with an error (HTTP 503).

    Also kombu's ``OperationalError``, which is what Celery's ``apply_async`` raises
    when the broker is down: code written for Celery keeps catching it. Inside
    ``transaction.atomic()`` a push is sent at the commit and never raises this (see
    docs/transactions.md).
    """


class TaskLost(BaseException):
    """Raised inside a task whose incarnation was superseded (its fence moved).

    A ``BaseException``, like ``CancelledError``, so a task's ``except Exception``
    cannot swallow it.
    """


class LockNotAcquired(RelierError):
    """``with lock(...)`` could not take the lock: another holder has it, and the lock
    is non-blocking or its ``timeout`` ran out.

    Attributes:
        name: the lock's name.
        timeout: how long it waited, in seconds (``0.0`` for a non-blocking lock).
    """

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(f"lock {name!r} not acquired within {timeout}s: another holder has it")
        self.name = name
        self.timeout = timeout


class LockLost(BaseException):
    """The lock this code relied on is no longer held by it: its key expired (a pause
    longer than the TTL, Redis unreachable for a whole TTL) or now holds another token.

    A ``BaseException``, like ``CancelledError`` and :class:`TaskLost`: code that ran
    under a lock it lost must stop, and a generic ``except Exception`` in that code
    (a retry loop, a "log and carry on") would otherwise catch the signal and keep
    writing as if it still had exclusive access.

    Attributes:
        name: the lock's name.
        token: the fencing token of the acquisition that was lost.
    """

    def __init__(self, name: str, token: int) -> None:
        super().__init__(f"lock {name!r} lost (token {token}): another holder may run now")
        self.name = name
        self.token = token
