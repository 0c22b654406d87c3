"""The store's layout record: how many partitions its keys are split into.

A process configured for another layout would look for every task in the wrong place
(another partition, or untagged keys): pushes it made would never be seen by the
workers, and the reverse. So the first process to reach a store records its layout
(``SET NX``, no TTL: a worker at start, ``manage.py check``, a producer at its first
push), and every process compares: a worker refuses to start on a mismatch, a producer
refuses to push, and ``manage.py check`` reports it (``relier.E015``). A producer
records or reads it once per process, whichever process stamped the store first: a
producer that reached a fresh store first and is configured otherwise than the
workers makes them refuse to start, loudly, instead of pushing where none looks.
"""

from __future__ import annotations

from typing import Any

from ..model.errors import ConfigError
from .keys import KeySpace


def mismatch(client: Any, keys: KeySpace) -> str | None:
    """Record ``keys``' layout if the store has none; the recorded one if it differs
    (None when it matches)."""
    mine = keys.layout_value()
    if client.set(keys.layout, mine, nx=True):
        return None
    recorded = client.get(keys.layout)
    # Deleted between the two calls (FLUSHALL): the next process records it again.
    return None if recorded in (None, mine) else str(recorded)


def describe(value: str) -> str:
    """A recorded layout in words, for error messages."""
    partitions, _, kind = value.partition(":")
    return f"PARTITIONS={partitions}" + (
        " with tagged keys (CLUSTER or PARTITIONS > 1)" if kind == "tagged" else " with plain keys"
    )


# (where, layout) pairs this process found matching: one round trip per process, not
# per push.
_matched: set[tuple[Any, ...]] = set()


def _refusal(keys: KeySpace, recorded: str) -> ConfigError:
    return ConfigError(
        f"the store was laid out for {describe(recorded)}, and this process is configured "
        f"for {describe(keys.layout_value())}: a push would store its task where no "
        "worker looks. Set PARTITIONS and CLUSTER as the store's other processes have "
        "them (docs/scaling.md)."
    )


def verify(client: Any, keys: KeySpace, where: tuple[Any, ...]) -> None:
    """Raise ConfigError if the store at ``where`` was recorded with another layout
    than ``keys``; record ``keys``' if it has none. One round trip (two when the record
    exists) per process and store: a push after the first asks nothing."""
    if (where, keys.layout_value()) in _matched:
        return
    recorded = None if client.set(keys.layout, keys.layout_value(), nx=True) else (
        client.get(keys.layout)
    )  # fmt: skip
    _compare(keys, recorded, where)


async def averify(client: Any, keys: KeySpace, where: tuple[Any, ...]) -> None:
    """:func:`verify` for async code."""
    if (where, keys.layout_value()) in _matched:
        return
    stamped = await client.set(keys.layout, keys.layout_value(), nx=True)
    _compare(keys, None if stamped else await client.get(keys.layout), where)


def _compare(keys: KeySpace, recorded: Any, where: tuple[Any, ...]) -> None:
    # None: this call recorded it, or it was deleted between the two calls (FLUSHALL),
    # when the next process records it again.
    if recorded is not None and recorded != keys.layout_value():
        raise _refusal(keys, str(recorded))
    _matched.add((where, keys.layout_value()))
