"""A chord's state in the store (``keys.chord``): the header's size, which the producer
writes before it pushes the header's last member, and the members' results, which
their commits record (``commit.lua``); the callback reads them when it starts."""

from __future__ import annotations

import json
from typing import Any

from .keys import KeySpace

# How long a chord's state is kept after its last write: a header that never completes
# (a member purged from the DLQ) does not stay for ever.
KEEP_MS = 7 * 24 * 3600 * 1000


class HeaderMissing(LookupError):
    """A chord callback's header results are gone (expired, or deleted by hand)."""


def set_size(client: Any, keys: KeySpace, group_id: str, size: int) -> None:
    """Record the header's size. Idempotent: the same value on every call."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.chord(group_id), "size", size)
    pipe.pexpire(keys.chord(group_id), KEEP_MS)
    pipe.execute()


def header_results(client: Any, keys: KeySpace, group_id: str) -> list[Any]:
    """The header members' results, in header order.

    Raises:
        HeaderMissing: the state is gone, or a member's result is missing.
    """
    state = client.hgetall(keys.chord(group_id))
    decoded = {_text(k): _text(v) for k, v in state.items()}
    size = decoded.get("size")
    if size is None:
        raise HeaderMissing(f"chord {group_id}: its header's state is gone")
    try:
        return [json.loads(decoded[f"r:{i}"]) for i in range(int(size))]
    except KeyError as exc:
        raise HeaderMissing(f"chord {group_id}: member {exc.args[0]} has no result") from exc


def forget(client: Any, keys: KeySpace, group_id: str) -> None:
    """Drop a chord's state once its callback committed."""
    client.delete(keys.chord(group_id))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
