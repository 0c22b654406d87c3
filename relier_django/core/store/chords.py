"""A chord's state in the store (``keys.chord``): the header's size, which the producer
writes before it pushes the header's last member, and the members' results, which
their commits record (``commit.lua``); the callback reads them when it starts."""

from __future__ import annotations

import json
from typing import Any

from .keys import KeySpace

# How long a chord's state is kept after its last write while its header may never
# complete: before its last member is stored (a producer that dies part-way through the
# header), and once a member's DLQ entry is deleted. A sealed state (every member
# stored: each ends in a commit or a DLQ entry) has no TTL: a member that waits longer
# (a long countdown, a DLQ entry released weeks later) still completes the header.
KEEP_MS = 7 * 24 * 3600 * 1000


class HeaderMissing(LookupError):
    """A chord callback's header results are gone (expired, or deleted by hand)."""


def set_size(client: Any, keys: KeySpace, group_id: str, size: int) -> None:
    """Record the header's size. Idempotent: the same value on every call."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.chord(group_id), "size", size)
    pipe.pexpire(keys.chord(group_id), KEEP_MS)
    pipe.execute()


def seal(client: Any, keys: KeySpace, group_id: str, index: int) -> bool:
    """After member ``index`` of the header is stored: when it is the last one (the
    size is known, ``set_size``), drop the state's TTL, so it lives until the callback
    commits (``forget``) or a member's DLQ entry is deleted (``dlq_delete.lua`` gives
    the TTL back). True when sealed. Not a check-then-act: the size, once written, never
    changes, and a seal is idempotent."""
    size = client.hget(keys.chord(group_id), "size")
    if size is None or int(size) != index + 1:
        return False
    return bool(client.persist(keys.chord(group_id)))


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
