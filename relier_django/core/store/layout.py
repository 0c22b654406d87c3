"""The store's layout record: how many partitions its keys are split into.

A process configured for another layout would look for every task in the wrong place
(another partition, or untagged keys): pushes it made would never be seen by the
workers, and the reverse. So the first process to reach a store records its layout
(``SET NX``, no TTL), and every process compares: a worker refuses to start on a
mismatch, and ``manage.py check`` reports it (``relier.E015``).
"""

from __future__ import annotations

from typing import Any

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
