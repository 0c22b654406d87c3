"""A task's argument schema: its version, and the migrations that upgrade older calls.

``@rl_task(version=3, migrations={1: v1_to_v2, 2: v2_to_v3})`` declares that the
task's arguments are at schema v3 and how to bring a call pushed at v1 or v2 up to
date. Every push carries the producer's version in its envelope; before a worker
runs an incarnation it applies the steps from the envelope's version to its own, in
order, in memory. The stored envelope is never rewritten: it stays what the producer
pushed, so that a retry, resurrection or release can still be run by a worker of
either version (or after a rollback), and migrating it again costs nothing but time.

What cannot be run goes to the DLQ with reason ``schema_migration`` (never to a
``TypeError`` in the task): a version newer than the worker's (an old worker during
a rolling deploy), one older than the oldest migration (a retired version), a
migration that raises or returns something else than ``(args, kwargs)``, and
arguments that do not fit the task's signature after migrating.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import RelierError

Migration = Callable[[list[Any], dict[str, Any]], tuple[Sequence[Any], Mapping[str, Any]]]
"""One step, from version N to N + 1: ``fn(args, kwargs) -> (args, kwargs)``.

It receives fresh copies (mutating them is fine) and may return any sequence and
mapping. It must be deterministic and free of side effects: it runs again for every
incarnation (retry, resurrection, release) and may run for a message that is then
refused as a duplicate. It runs in a worker thread, so it may read from a database.
"""


class SchemaMismatch(RelierError):
    """An envelope's arguments cannot be brought to the worker's schema.

    Attributes:
        task: the task's name.
        envelope_version: the schema version the envelope was pushed with.
        worker_version: the task's schema version in this worker's code.
    """

    def __init__(
        self, message: str, *, task: str, envelope_version: int, worker_version: int
    ) -> None:
        super().__init__(message)
        self.task = task
        self.envelope_version = envelope_version
        self.worker_version = worker_version


@dataclass(frozen=True, slots=True)
class Call:
    """The arguments a task is called with, after migration."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    migrated_from: int | None = None  # the envelope's version, when steps ran


def _frozen(migrations: Mapping[int, Migration]) -> Mapping[int, Migration]:
    return MappingProxyType(dict(sorted(migrations.items())))


@dataclass(frozen=True, slots=True)
class Schema:
    """A task's schema version and its migrations (``from_version -> step``).

    The migrations must form one unbroken chain ending at ``version``: with
    ``version=4``, ``{2: a, 3: b}`` upgrades v2 and v3 calls, and v1 calls are
    *retired* (dead-lettered). A chain with a hole (``{1: a, 3: b}``) is refused,
    since the versions below the hole could never arrive.

    Raises:
        ValueError: ``version`` below 1, or a migration key outside 1..version-1, or
            a hole in the chain.
        TypeError: a version that is not an int, or a migration that is not callable.
    """

    version: int = 1
    # Out of the hash (a mapping has none), so a TaskSpec stays hashable.
    migrations: Mapping[int, Migration] = field(default_factory=lambda: _frozen({}), hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool):
            raise TypeError(f"version must be an int, got {self.version!r}")
        if self.version < 1:
            raise ValueError(f"version must be >= 1, got {self.version}")
        if not isinstance(self.migrations, Mapping):
            raise TypeError("migrations must be a dict {from_version: fn(args, kwargs)}")
        for key, step in self.migrations.items():
            if not isinstance(key, int) or isinstance(key, bool) or not 1 <= key < self.version:
                raise ValueError(
                    f"migrations key {key!r}: a migration upgrades from_version to "
                    f"from_version + 1, so keys are ints in 1..{self.version - 1} "
                    f"(version={self.version})"
                )
            if not callable(step):
                raise TypeError(f"migrations[{key}] must be callable, got {step!r}")
        missing = [n for n in range(self.oldest, self.version) if n not in self.migrations]
        if missing:
            raise ValueError(
                f"migrations have a hole: no step from v{missing[0]} to v{missing[0] + 1}, "
                f"so a v{self.oldest} call could never reach v{self.version}; add "
                f"migrations[{missing[0]}]"
            )
        object.__setattr__(self, "migrations", _frozen(self.migrations))

    @property
    def oldest(self) -> int:
        """The oldest envelope version this schema can run."""
        return min(self.migrations, default=self.version)

    def check(self, task: str, version: int) -> None:
        """Raise :class:`SchemaMismatch` if an envelope of ``version`` cannot run here.

        Cheap (runs no migration): lets a worker refuse before doing any work.
        """
        mismatch = _mismatch(task, version, self.version)
        if version > self.version:
            raise mismatch(
                f"envelope schema v{version} > this worker's v{self.version} of {task}: "
                "it was pushed by newer code. Deploy the new code to every worker, then "
                "release it (manage.py relier_dlq release --all --reason schema_migration)"
            )
        if version < self.oldest:
            raise mismatch(
                f"envelope schema v{version} of {task} has no migration path to "
                f"v{self.version} (migrations start at v{self.oldest}): add "
                f"migrations[{version}] and deploy, then release it, or push it again "
                "with current arguments"
            )

    def upgrade(
        self, task: str, version: int, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Call:
        """Bring a call pushed at ``version`` to this schema's version.

        When the call is already current no step runs and nothing is deep-copied.

        Raises:
            SchemaMismatch: see :meth:`check`; or a migration raised (the exception
                is its ``__cause__``), or returned something else than
                ``(args, kwargs)``.
        """
        self.check(task, version)
        if version == self.version:
            return Call(tuple(args), dict(kwargs))
        cur_args, cur_kwargs = list(copy.deepcopy(args)), dict(copy.deepcopy(kwargs))
        for step_from in range(version, self.version):
            cur_args, cur_kwargs = self._step(task, version, step_from, cur_args, cur_kwargs)
        return Call(tuple(cur_args), cur_kwargs, migrated_from=version)

    def _step(
        self, task: str, version: int, step_from: int, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        step = self.migrations[step_from]
        label = f"migration v{step_from}→v{step_from + 1} of {task}"
        mismatch = _mismatch(task, version, self.version)
        try:
            out = step(args, kwargs)
        except Exception as exc:
            raise mismatch(
                f"{label} raised {type(exc).__name__}: {exc}. Fix the migration and "
                "deploy, then release it"
            ) from exc
        if not (
            isinstance(out, tuple)
            and len(out) == 2
            and isinstance(out[0], Sequence)
            and not isinstance(out[0], str | bytes)
            and isinstance(out[1], Mapping)
            and all(isinstance(k, str) for k in out[1])
        ):
            raise mismatch(
                f"{label} returned {_describe(out)}; a migration returns (args, kwargs): "
                "a list and a dict with str keys"
            )
        return list(out[0]), dict(out[1])

    def fit(self, task: str, signature: inspect.Signature, call: Call) -> None:
        """Raise :class:`SchemaMismatch` unless ``call`` binds to ``signature``.

        Catches a migration that produced the wrong shape, and a signature changed
        without a version bump, before the task is called.
        """
        shape = (len(call.args), tuple(sorted(call.kwargs)))
        try:
            error = _bind_error(signature, *shape)
        except TypeError:  # an unhashable default value (def f(x=[])): not cached
            error = _bind_error.__wrapped__(signature, *shape)
        if error is not None:
            if call.migrated_from is not None:
                how = f"after migrating v{call.migrated_from}→v{self.version}"
                fix = "fix the migration and deploy, then release it"
            else:
                how = f"at schema v{self.version}"
                fix = (
                    "if the signature changed, bump @rl_task(version=) and add a "
                    "migration; deploy, then release it"
                )
            raise _mismatch(task, call.migrated_from or self.version, self.version)(
                f"the arguments {how} do not fit {task}{_plain(signature)}: {error}; {fix}"
            ) from None


@functools.lru_cache(maxsize=1024)
def _bind_error(signature: inspect.Signature, n_args: int, names: tuple[str, ...]) -> str | None:
    """Why ``n_args`` positional and ``names`` keyword arguments do not bind, or None.
    Binding looks at nothing else (no values, no annotations), so each shape of call
    is worked out once per signature instead of on every run."""
    try:
        signature.bind(*([None] * n_args), **dict.fromkeys(names))
    except TypeError as exc:
        return str(exc)
    return None


def _mismatch(task: str, version: int, worker: int) -> Callable[[str], SchemaMismatch]:
    return lambda message: SchemaMismatch(
        message, task=task, envelope_version=version, worker_version=worker
    )


def _plain(signature: inspect.Signature) -> inspect.Signature:
    # Names and defaults say what to pass; annotations may be unevaluated strings.
    params = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return signature.replace(parameters=params, return_annotation=signature.empty)


def _describe(value: object) -> str:
    text = repr(value)
    return f"a {type(value).__name__} ({text[:80]}{'…' if len(text) > 80 else ''})"
