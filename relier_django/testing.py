"""Test helpers: run pushes in the test's own process, or record them, so a test suite
never reaches a developer's Redis or worker (docs/testing.md).

- :func:`eager`: every push runs in this process (as ``CELERY_TASK_ALWAYS_EAGER`` or
  ``RELIER["EAGER"]`` do), with relier's semantics: validation, idempotency, retries,
  ``TaskFailed``.
- :func:`capture_pushes`: every push is validated and recorded, not run; the test
  asserts on what was pushed and runs the pushes it wants, with eager semantics.

Pytest fixtures, for a ``conftest.py`` (``pytest_plugins = ["relier_django.testing"]``
or ``from relier_django.testing import relier_pushes, relier_eager``):
``relier_pushes`` (a :class:`CapturedPushes`), ``relier_eager`` and
``relier_eager_immediate``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from .core.model.config import Config
from .core.model.envelope import Envelope
from .core.model.spec import TaskSpec
from .core.push import eager as _eager
from .core.push.eager import EagerReceipt
from .core.store.receipt import Receipt

__all__ = [
    "CapturedPush",
    "CapturedPushes",
    "EagerReceipt",
    "capture_pushes",
    "eager",
    "reset",
]


def reset() -> None:
    """Forget the idempotency keys that eager runs took in this process, so a test does
    not see a previous test's results as duplicates. :func:`eager` and
    :func:`capture_pushes` call it on entry and exit."""
    _eager.forget()


@contextlib.contextmanager
def eager(*, propagate: bool = False, immediate: bool = False) -> Iterator[None]:
    """Run every push made inside the block in this process, whatever the settings.

    Args:
        propagate: a failed task's exception is raised from ``push()`` (Celery's
            ``task_eager_propagates``); else ``receipt.get()`` raises ``TaskFailed``.
        immediate: a push made inside a transaction runs at once too, as with
            Celery's ``task_always_eager``; else it runs when the transaction commits
            (never, in a test that pytest-django wraps in a transaction).
    """
    reset()
    _eager.override(_eager.Mode(eager=True, propagates=propagate, immediate=immediate))
    try:
        yield
    finally:
        _eager.override(None)
        reset()


@dataclass(frozen=True, slots=True)
class CapturedPush:
    """One push recorded by :func:`capture_pushes`: validated, never sent.

    Attributes:
        task: the task's name.
        args: its positional arguments, as pushed (a tuple).
        kwargs: its keyword arguments.
        task_id: the id its receipt carries.
        queue: the queue it would go to (``""``: Celery's default).
        receipt: what ``push()`` returned: ``pending`` until the push is run.
    """

    task: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    task_id: str
    queue: str
    receipt: EagerReceipt = field(repr=False)
    _spec: TaskSpec = field(repr=False)
    _app: Any = field(repr=False)
    _envelope: Envelope = field(repr=False)

    @property
    def ran(self) -> bool:
        """True once :meth:`run` (or ``run_all``) ran it."""
        return not self.receipt.pending

    def run(self) -> Receipt:
        """Run it now, in this process, with eager semantics (idempotency, retries,
        ``TaskFailed`` from ``receipt.get()``); an ``async def`` task in a loop of its
        own. Returns the push's receipt, settled.

        Raises:
            RuntimeError: it already ran.
        """
        if self.ran:
            raise RuntimeError(f"captured push {self.task} {self.task_id} already ran")
        _eager.deliver(self._spec, self._app, self._envelope, self.receipt)
        return self.receipt


def _name(task: Any) -> str:
    return task if isinstance(task, str) else str(task.name)


def _call(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    shown = [*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]
    return f"{name}({', '.join(shown)})"


class CapturedPushes(Sequence[CapturedPush]):
    """Every push made while :func:`capture_pushes` is open, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pushes: list[CapturedPush] = []

    def __call__(self, spec: TaskSpec, app: Any, env: Envelope, cfg: Config) -> Receipt:
        # The interceptor the producer calls after validation.
        receipt = EagerReceipt.deferred(env.id, cfg)
        assert isinstance(receipt, EagerReceipt)
        captured = CapturedPush(
            env.task, env.args, dict(env.kwargs), env.id, env.queue, receipt, spec, app, env
        )
        with self._lock:
            self._pushes.append(captured)
        return receipt

    @overload
    def __getitem__(self, index: int) -> CapturedPush: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[CapturedPush]: ...
    def __getitem__(self, index: int | slice) -> CapturedPush | Sequence[CapturedPush]:
        with self._lock:
            return self._pushes[index]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pushes)

    def __repr__(self) -> str:
        return f"<CapturedPushes [{', '.join(_call(p.task, p.args, p.kwargs) for p in self)}]>"

    @property
    def names(self) -> list[str]:
        """The task name of every push, in order."""
        return [p.task for p in self]

    def of(self, task: Any) -> list[CapturedPush]:
        """The pushes of one task (the task object or its name), in order."""
        name = _name(task)
        return [p for p in self if p.task == name]

    def assert_pushed(self, task: Any, *args: Any, **kwargs: Any) -> CapturedPush:
        """The one push of ``task`` with exactly these arguments (any, when none are
        given and there is one push of it).

        Raises:
            AssertionError: none, or more than one, matched; the message lists the
                pushes of ``task`` that were made.
        """
        pushes = self.of(task)
        if args or kwargs:
            matched = [p for p in pushes if p.args == args and p.kwargs == kwargs]
        else:
            matched = pushes
        if len(matched) != 1:
            wanted = _call(_name(task), args, kwargs) if args or kwargs else _name(task)
            made = ", ".join(_call(p.task, p.args, p.kwargs) for p in pushes) or "none"
            raise AssertionError(
                f"expected one push of {wanted}, found {len(matched)}; pushes of it: {made}"
            )
        return matched[0]

    def assert_not_pushed(self, task: Any = None) -> None:
        """Nothing was pushed (of ``task``, when given).

        Raises:
            AssertionError: naming what was pushed.
        """
        pushes = list(self) if task is None else self.of(task)
        if pushes:
            raise AssertionError(f"expected no push, found {[p.task for p in pushes]}")

    def run_all(self) -> list[Receipt]:
        """Run every push not run yet, in order, including the pushes those runs make,
        until none is left. Returns their receipts."""
        done: list[Receipt] = []
        while pending := [p for p in self if not p.ran]:
            done.extend(p.run() for p in pending)
        return done

    def clear(self) -> None:
        """Forget every recorded push."""
        with self._lock:
            self._pushes.clear()


@contextlib.contextmanager
def capture_pushes() -> Iterator[CapturedPushes]:
    """Record every push made inside the block instead of sending it.

    Each push is validated as usual (bad arguments raise at ``push()``), and nothing is
    stored or sent: the block's pushes never reach Redis or a broker, in eager mode or
    not. The receipts are ``pending`` until the push is run (``captured.run_all()``,
    ``captured[0].run()``), then they hold the outcome. Pushes are recorded when
    ``push()`` is called, inside a transaction or not (a rollback does not remove one).
    """
    captured = CapturedPushes()
    reset()
    _eager.push_interceptor(captured)
    try:
        yield captured
    finally:
        _eager.pop_interceptor(captured)
        reset()


try:
    import pytest
except ImportError:  # pragma: no cover - the fixtures need pytest; the rest does not
    pass
else:

    @pytest.fixture
    def relier_pushes() -> Iterator[CapturedPushes]:
        """Every push the test makes, recorded and not sent (:func:`capture_pushes`)."""
        with capture_pushes() as captured:
            yield captured

    @pytest.fixture
    def relier_eager() -> Iterator[None]:
        """Every push the test makes runs in the test's process (:func:`eager`); one
        made inside a transaction runs when it commits."""
        with eager():
            yield

    @pytest.fixture
    def relier_eager_immediate() -> Iterator[None]:
        """Every push the test makes runs in the test's process at once, inside a
        transaction too (:func:`eager` with ``immediate=True``): for tests marked
        ``django_db``, whose transaction pytest-django rolls back, never commits."""
        with eager(immediate=True):
            yield
