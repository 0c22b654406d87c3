"""Flow control: how many incarnations of a task (or of a named limit) hold a slot at
once, and how often they may be dispatched, per key. Pure; no I/O. The store's side is
``store/lua/_limits.lua`` and ``schedule_take.lua`` (docs/flow-control.md).

A task's options (``@rl_task(concurrency=, concurrency_key=, limit=, rate=)``) and the
named limits of the settings (``RELIER["LIMITS"]``) make, for each push, a
:class:`Gate`: the scope whose slots it needs, the key it is parked under while none
is free, the scope's capacity, and the rate it is dispatched at. Scopes:

- ``concurrency=N`` on a task: at most N of its tasks hold a slot at once; with
  ``concurrency_key``, each key its own N (``t:<task>|<key>``).
- ``limit="name"``: the named limit's ``concurrency`` is shared by every task naming
  it. With a key (``concurrency_key``), by default the slots are still shared, and
  parked tasks are handed the freed slots key by key in turn (fairness); with
  ``"per_key": True`` in the limit, each key has its own slots.
- ``rate`` (the task's, or the named limit's): dispatches per window, in the same
  scope as the slots (per key when a key is given).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .rates import Rate

KeyOption = str | Callable[..., Any] | None
# What a limit key may be: a bounded, printable string (it names Redis keys).
_MAX_KEY = 128
# The separator between a scope and its key in key names (never in a task name).
_SEP = "|"


@dataclass(frozen=True, slots=True)
class NamedLimit:
    """One entry of ``RELIER["LIMITS"]``."""

    name: str
    concurrency: int | None = None
    rate: Rate | None = None
    per_key: bool = False


@dataclass(frozen=True, slots=True)
class TaskLimits:
    """A task's flow-control options, checked at decoration."""

    concurrency: int | None = None
    concurrency_key: KeyOption = None
    limit: str | None = None
    rate: Rate | None = None

    def __bool__(self) -> bool:
        return bool(self.concurrency or self.limit or self.rate)


@dataclass(frozen=True, slots=True)
class Gate:
    """What one push needs of the store's flow control (push.lua stores it in the task's
    hash; schedule_take.lua applies it when the task is due).

    ``scope``: the slots' scope ('' for none), ``parked_key``: the key its task waits
    under while no slot is free (fairness turns between keys), ``capacity``: the
    scope's slots; ``rate_scope`` ('' for none), ``interval_ms``: the rate's emission
    interval, ``burst_ms``: how far ahead of its interval a dispatch may be (the rate's
    count, less one, times the interval: a full window's count at once, never more)."""

    scope: str = ""
    parked_key: str = ""
    capacity: int = 0
    rate_scope: str = ""
    interval_ms: int = 0
    burst_ms: int = 0

    def script_arg(self) -> str:
        """The gate as push.lua's one argument: its fields joined by tabs."""
        fields = (self.scope, self.parked_key, self.capacity, self.rate_scope,
                  self.interval_ms, self.burst_ms)  # fmt: skip
        return "\t".join(str(f) for f in fields)


def check_options(
    concurrency: int | None, concurrency_key: KeyOption, limit: str | None, rate: str | None
) -> TaskLimits:
    """``@rl_task``'s flow-control options, or a clear error at decoration.

    Raises:
        ValueError: a concurrency below 1, a rate that is not one, a key without a
            concurrency or limit, a limit name that cannot name a key.
        TypeError: values of the wrong type.
    """
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ValueError(f"concurrency= takes an int >= 1, got {concurrency!r}")
    if concurrency_key is not None and not (
        (isinstance(concurrency_key, str) and concurrency_key) or callable(concurrency_key)
    ):
        raise TypeError(
            "concurrency_key= takes the name of one of the task's arguments, or a callable "
            f"of its arguments returning the key, got {concurrency_key!r}"
        )
    if concurrency_key is not None and concurrency is None and limit is None and rate is None:
        raise ValueError("concurrency_key= needs concurrency=, rate= or limit= to key")
    if limit is not None and concurrency is not None:
        raise ValueError(
            "give concurrency= or limit=, not both: a named limit has its own concurrency "
            "(RELIER['LIMITS'])"
        )
    if limit is not None and (not isinstance(limit, str) or not _nameable(limit)):
        raise ValueError(f"limit= takes the name of a RELIER['LIMITS'] entry, got {limit!r}")
    parsed = Rate.parse(rate) if rate is not None else None
    return TaskLimits(concurrency, concurrency_key, limit, parsed)


def check_key_argument(limits: TaskLimits, signature: inspect.Signature, task: str) -> None:
    """A ``concurrency_key`` naming an argument must name one of the task's."""
    key = limits.concurrency_key
    if isinstance(key, str) and key not in signature.parameters:
        names = ", ".join(signature.parameters) or "none"
        raise ValueError(
            f"{task}: concurrency_key={key!r} names no argument of the task (its arguments: "
            f"{names}); give an argument's name or a callable of the arguments"
        )


def named_limits(entries: Sequence[str]) -> dict[str, NamedLimit]:
    """``RELIER["LIMITS"]`` as name -> limit. Each entry is ``name=<JSON object>`` (the
    settings dict ``{"stripe": {"concurrency": 5}}`` is read so).

    Raises:
        ConfigError: an entry that is not a limit, naming what is wrong.
    """
    found: dict[str, NamedLimit] = {}
    for entry in entries:
        name, sep, text = entry.partition("=")
        name = name.strip()
        if not sep or not _nameable(name):
            raise ConfigError(f"limits: {entry!r} is not 'name=' and a limit")
        try:
            spec = json.loads(text)
        except ValueError:
            raise ConfigError(
                f"limits[{name}]: {text!r} is not a limit: give a dict such as "
                '{"concurrency": 5, "rate": "100/s"}'
            ) from None
        if not isinstance(spec, dict) or not spec:
            raise ConfigError(f"limits[{name}] must be a non-empty dict, got {spec!r}")
        unknown = set(spec) - {"concurrency", "rate", "per_key"}
        if unknown:
            raise ConfigError(
                f"limits[{name}] has unknown keys {sorted(unknown)}: a limit takes "
                "concurrency, rate and per_key"
            )
        concurrency, rate, per_key = spec.get("concurrency"), spec.get("rate"), spec.get("per_key")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigError(
                f"limits[{name}]: concurrency must be an int >= 1, got {concurrency!r}"
            )
        if concurrency is None and rate is None:
            raise ConfigError(f"limits[{name}] needs a concurrency or a rate")
        if per_key is not None and not isinstance(per_key, bool):
            raise ConfigError(f"limits[{name}]: per_key must be true or false, got {per_key!r}")
        try:
            parsed = Rate.parse(rate) if rate is not None else None
        except ValueError as exc:
            raise ConfigError(f"limits[{name}]: {exc}") from None
        found[name] = NamedLimit(name, concurrency, parsed, bool(per_key))
    return found


def check_call(limit: Any, key: Any, where: str) -> tuple[str | None, str | None]:
    """One call's own flow control (``push_with(limit=, concurrency_key=)``,
    ``apply_async``, a signature's ``.set()``, a periodic entry's ``options``): the
    named limit it goes through instead of its task's, and its key, the value itself.
    Whether the name is in ``RELIER["LIMITS"]`` is checked at push (:func:`gate_of`).

    Raises:
        ValueError: a limit that cannot name a limit, a key that is not 1 to 128
            printable characters (an int is its decimal text).
        TypeError: a limit that is not a str, a key that is not a str or an int.
    """
    if limit is not None and not isinstance(limit, str):
        raise TypeError(f"{where}: limit= takes a RELIER['LIMITS'] name, got {limit!r}")
    if limit is not None and not _nameable(limit):
        raise ValueError(f"{where}: limit={limit!r} cannot name a RELIER['LIMITS'] entry")
    if key is None:
        return limit, None
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise TypeError(
            f"{where}: concurrency_key= at a call takes the key itself (a str or an int), "
            f"got {key!r}"
        )
    return limit, _checked_key(str(key), where)


def gate_of(
    task: str,
    limits: TaskLimits,
    named: Mapping[str, NamedLimit],
    signature: inspect.Signature,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    call_limit: str | None = None,
    call_key: str | None = None,
) -> Gate | None:
    """The gate one push of ``task`` with these arguments goes through; None when the
    task has no flow control.

    ``call_limit``: the push's own named limit (:func:`check_call`), which replaces
    the task's flow control (its ``concurrency=``, ``limit=`` and ``rate=``);
    ``call_key``: the push's own key, which replaces the one the task's
    ``concurrency_key`` would derive.

    Raises:
        ConfigError: a ``limit=`` the settings do not define.
        ValueError: a key that is not a short printable string (or an int); a call's
            key for a task and call with no limit to key.
    """
    if call_limit is not None:
        limits = TaskLimits(concurrency_key=limits.concurrency_key, limit=call_limit)
    if call_key is not None and not limits:
        raise ValueError(
            f"{task}: concurrency_key={call_key!r} keys nothing: the task has no "
            "concurrency=, limit= or rate=, and the call gives no limit="
        )
    if not limits:
        return None
    if call_key is not None:
        key: str | None = call_key
    else:
        key = _key_of(limits.concurrency_key, signature, args, kwargs, task)
    if limits.limit is not None:
        found = named.get(limits.limit)
        if found is None:
            known = ", ".join(sorted(named)) or "none defined"
            raise ConfigError(
                f"{task}: limit={limits.limit!r} is not in RELIER['LIMITS'] ({known}); add "
                f'it, e.g. RELIER["LIMITS"] = {{"{limits.limit}": {{"concurrency": 5}}}}'
            )
        base, own_key, capacity, rate = (
            f"n:{found.name}",
            found.per_key,
            found.concurrency,
            found.rate,
        )
    else:
        base, own_key, capacity, rate = f"t:{task}", True, limits.concurrency, None
    if limits.rate is not None:
        rate = limits.rate  # the task's own rate wins over its named limit's
    # Per key: the key is part of the scope. Shared by the keys of a named limit: the
    # scope is the limit's, and the key only says whose turn a freed slot is.
    scope = base + (_SEP + key if key is not None and own_key else "")
    parked = key if key is not None and not own_key else ""
    interval, burst = emission(rate) if rate is not None else (0, 0)
    return Gate(scope if capacity else "", parked if capacity else "", capacity or 0,
                scope if rate is not None else "", interval, burst)  # fmt: skip


def emission(rate: Rate) -> tuple[int, int]:
    """A rate as its GCRA keeps it: (the emission interval, the burst allowance), ms.
    A dispatch may go once the scope's reserved time, less the allowance, has come."""
    interval = max(1, rate.window_ms // rate.limit)
    return interval, interval * (rate.limit - 1)


def _key_of(
    option: KeyOption,
    signature: inspect.Signature,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    task: str,
) -> str | None:
    if option is None:
        return None
    if callable(option):
        value = option(*args, **kwargs)
    else:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        value = bound.arguments[option]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(
            f"{task}: its concurrency key must be a str or an int, got {value!r} "
            f"({type(value).__name__})"
        )
    return _checked_key(str(value), task)


def _checked_key(text: str, where: str) -> str:
    if not text or len(text) > _MAX_KEY or not text.isprintable() or _SEP in text:
        raise ValueError(
            f"{where}: its concurrency key {text[:40]!r} must be 1 to {_MAX_KEY} printable "
            f"characters without {_SEP!r}"
        )
    return text


def _nameable(name: str) -> bool:
    return bool(name) and len(name) <= _MAX_KEY and name.isprintable() and _SEP not in name
