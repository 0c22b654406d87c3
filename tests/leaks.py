"""G7: after a workload drains, the only relier keys left are results and idempotency
claims (each with a TTL), DLQ entries and what they hold (a chord's state, while one of
its members waits there), and the scanner leader lease."""

from __future__ import annotations

import fnmatch

from relier_django.core.store.keys import KeySpace


def assert_no_leaked_keys(client, keys: KeySpace | None = None) -> None:
    keys = keys or KeySpace("rl")
    with_ttl, owned = keys.expiring_patterns(), keys.owned_patterns()
    leaked, no_ttl = [], []
    held = _chords_held_in_the_dlq(client, keys)
    for raw in client.scan_iter(match=keys.all_pattern(), count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        if any(fnmatch.fnmatchcase(key, p) for p in with_ttl):
            # A sealed chord's state has no TTL while a member waits in the DLQ: that
            # entry owns it (deleting it gives the state its TTL back, dlq_delete.lua).
            if client.ttl(key) < 0 and key not in held:
                no_ttl.append(key)
        elif not any(fnmatch.fnmatchcase(key, p) for p in owned):
            leaked.append(key)
    assert not leaked, f"working keys left after the workload drained: {sorted(leaked)[:10]}"
    assert not no_ttl, f"keys that should expire but have no TTL: {sorted(no_ttl)[:10]}"


def _chords_held_in_the_dlq(client, keys: KeySpace) -> set[str]:  # type: ignore[no-untyped-def]
    """The chord states a DLQ entry holds (its field 'chord', the chord's group id)."""
    held = set()
    for part in keys.parts():
        for raw in client.scan_iter(match=part.dlq_entry("*"), count=1000):
            group = client.hget(raw, "chord")
            if group:
                held.add(part.chord(group.decode() if isinstance(group, bytes) else group))
    return held
