"""The rule a task's arguments follow: they come out of JSON as they went in.

``check`` runs on every push, before anything is stored (G6). Pure; no I/O.
See docs/api.md, "Arguments are JSON".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ArgumentsTooLarge
from .spec import TaskSpec

# json would quietly turn the key 1 into "1" (so the task's d[1] fails, and {1: "x"}
# would share an idempotency key with {"1": "x"}), and deep nesting would escape as a
# RecursionError. Tuples are the one conversion allowed, as Celery's JSON and
# django.tasks allow it: they arrive as lists, indexed and iterated the same.
MAX_ARGUMENT_DEPTH = 100
"""How many levels of lists and dicts one argument may nest."""

_INF = float("inf")
_SCALARS = frozenset({str, int, bool, type(None)})
_JSON_RULE = (
    "arguments must come out of JSON as they went in: str, int, float (finite), bool, "
    f"None, list (a tuple arrives as a list) and dict with str keys, nested at most "
    f"{MAX_ARGUMENT_DEPTH} levels deep; pass e.g. an id instead of a model instance"
)


class _NotJson(Exception):
    """What ``_walk`` refused. ``path`` (innermost step first) is filled in while the
    recursion unwinds; None when it is not worth showing (too deep)."""

    def __init__(self, what: str, why: str, path: list[str] | None) -> None:
        super().__init__(what)
        self.what, self.why, self.path = what, why, path


def _walk(value: Any, depth: int) -> None:
    """Raise ``_NotJson`` unless ``value`` survives a JSON round trip unchanged.

    ``depth`` counts the lists and dicts around ``value``. Exact type tests come first:
    this runs on every push, and nearly every value is one of these.
    """
    kind = type(value)
    if kind in _SCALARS:
        return
    if isinstance(value, list | tuple | dict):
        if depth >= MAX_ARGUMENT_DEPTH:
            raise _NotJson(
                f"lists or dicts nested more than {MAX_ARGUMENT_DEPTH} levels deep",
                "or a list or dict that contains itself",
                None,
            )
        _walk_items(value, depth + 1)
    elif isinstance(value, float):
        if not -_INF < value < _INF:  # also False for nan
            raise _NotJson(f"the float {value!r}", "which JSON cannot carry", [])
    elif not isinstance(value, str | int):  # a StrEnum or IntEnum comes back equal
        raise _NotJson(f"a {kind.__name__}", "which cannot be sent as JSON", [])


def _walk_items(container: list[Any] | tuple[Any, ...] | dict[Any, Any], depth: int) -> None:
    if isinstance(container, dict):
        for key, item in container.items():
            if not isinstance(key, str):
                raise _NotJson(
                    f"the dict key {key!r} ({type(key).__name__})",
                    "which JSON would turn into a string",
                    [f"[{key!r}]"],
                )
            if type(item) in _SCALARS:
                continue  # saves a call per leaf
            try:
                _walk(item, depth)
            except _NotJson as exc:
                if exc.path is not None:
                    exc.path.append(f"[{key!r}]")
                raise
    else:
        for index, item in enumerate(container):
            if type(item) in _SCALARS:
                continue
            try:
                _walk(item, depth)
            except _NotJson as exc:
                if exc.path is not None:
                    exc.path.append(f"[{index}]")
                raise


def check(spec: TaskSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` unless the call fits ``spec``'s signature and every argument
    comes out of JSON as it went in; the message names the argument and the path to
    the value, and the rule."""
    signature = spec.user_signature()
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{spec.name}: {exc}") from None
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        try:
            if kind is kind.VAR_POSITIONAL:  # a tuple made by the call, not a value
                _walk_items(list(value), 0)
            elif kind is kind.VAR_KEYWORD:  # a dict made by the call, str keys
                _walk_items(value, 0)
            else:
                _walk(value, 0)
        except _NotJson as exc:
            if exc.path is None:
                shown = f"argument {name!r} holds {exc.what}"
            elif exc.path:
                where = name + "".join(reversed(exc.path))
                shown = f"argument {name!r} holds {exc.what} at {where}"
            else:
                shown = f"argument {name!r} is {exc.what}"
            raise TypeError(f"{spec.name}: {shown}, {exc.why}; {_JSON_RULE}") from None


def check_size(
    spec: TaskSpec, args: Sequence[Any], kwargs: Mapping[str, Any], encoded: str, limit: int
) -> None:
    """Raise ``ArgumentsTooLarge`` when the encoded task is above ``limit`` bytes,
    naming the largest argument. A UTF-8 character takes at most 4 bytes, so a task
    well within the limit is not even encoded to count them."""
    if len(encoded) * 4 <= limit:
        return
    size = len(encoded.encode())
    if size <= limit:
        return
    sizes = {f"args[{i}]": _encoded_size(value) for i, value in enumerate(args)}
    sizes.update({f"kwargs[{name!r}]": _encoded_size(value) for name, value in kwargs.items()})
    largest = max(sizes, key=sizes.__getitem__, default="(none)")
    raise ArgumentsTooLarge(spec.name, size, limit, largest, sizes.get(largest, 0))


def _encoded_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
