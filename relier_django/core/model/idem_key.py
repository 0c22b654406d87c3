"""Logical idempotency keys: the ``idempotency_key`` option of a task, and the key it
derives from a call's arguments. Pure; the claim itself is ``push.idempotency``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .envelope import canonical

KeyOption = str | Callable[..., str] | None


def derive_key(option: KeyOption, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The logical idempotency key: explicit, computed by a callable of the arguments,
    or (default) the canonical JSON of the arguments. The task name is added when the
    Redis key is built, so two tasks never share a key."""
    if option is None:
        return canonical({"args": list(args), "kwargs": dict(kwargs)})
    if callable(option):
        value = option(*args, **kwargs)
        if not isinstance(value, str) or not value:
            raise TypeError(f"idempotency_key callable must return a non-empty str, got {value!r}")
        return value
    return option
