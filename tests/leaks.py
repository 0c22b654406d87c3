"""G7: after a workload drains, the only relier keys left are results and idempotency
claims (each with a TTL), DLQ entries and the scanner leader lease."""

from __future__ import annotations

import fnmatch

from relier_django.core.store.keys import KeySpace


def assert_no_leaked_keys(client, keys: KeySpace | None = None) -> None:
    keys = keys or KeySpace("rl")
    with_ttl, owned = keys.expiring_patterns(), keys.owned_patterns()
    leaked, no_ttl = [], []
    for raw in client.scan_iter(match=keys.all_pattern(), count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        if any(fnmatch.fnmatchcase(key, p) for p in with_ttl):
            if client.ttl(key) < 0:
                no_ttl.append(key)
        elif not any(fnmatch.fnmatchcase(key, p) for p in owned):
            leaked.append(key)
    assert not leaked, f"working keys left after the workload drained: {sorted(leaked)[:10]}"
    assert not no_ttl, f"keys that should expire but have no TTL: {sorted(no_ttl)[:10]}"
