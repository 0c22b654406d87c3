"""Clients of a Redis Cluster store (``config.cluster``): redis-py's, made to wait out a
failover the way relier's other clients do.

redis-py's cluster client retries a failed call at once, after re-reading the slot map:
its retry policy gives only the number of tries, never a pause (``redis/cluster.py``,
``execute_command``), so all of them are spent within tens of milliseconds, while a
cluster takes seconds to promote a replica. Here each call is made in rounds spaced by
relier's backoff (``retrying``): within a round redis-py tries twice, on the slot map it
re-read; a failover that completes within the backoff's budget is invisible to callers,
as a Sentinel failover is.

A client is built from ``redis_url`` (any node), then from every node this process (or
its parent, before a fork) has seen: a pool process forked after the seed node died
should still find the cluster (not yet covered by a test; docs/operations.md says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis
import redis.asyncio.cluster
import redis.backoff
import redis.cluster
import redis.connection
import redis.retry

from ..model.config import Config
from .retrying import AsyncRetry, Retry, backoff, retries_within

# What a round may fail with and still be worth another: a node away, a slot without a
# master while a replica is promoted.
_TRANSIENT = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.TryAgainError,
)
# Within a round: one immediate retry on the re-read slot map (a MOVED slot, a node
# replaced), which is what redis-py's own retries are good for.
_IN_ROUND = redis.retry.Retry(redis.backoff.NoBackoff(), 1)

# (host, port) of every node a client of this process has seen, by the URL that named
# the cluster (a process may talk to two). Kept across a fork on purpose: a pool process
# starts from what its parent knew.
_seen: dict[str, set[tuple[str, int]]] = {}


# redis-py's annotation asks for RedisError subclasses; it catches whatever it is given,
# and SlotNotCoveredError is a RedisClusterException.
_TRANSIENT_TYPED = cast("tuple[type[redis.exceptions.RedisError], ...]", _TRANSIENT)


def _rounds(policy: type[Retry] | type[AsyncRetry], fail_fast: bool, budget_s: float) -> Any:
    retries = 0 if fail_fast else retries_within(budget_s)
    return policy(backoff(), retries, supported_errors=_TRANSIENT_TYPED)


class SyncCluster(redis.cluster.RedisCluster):
    """redis-py's cluster client, with relier's backoff between rounds of tries."""

    # One round until the builder sets relier's (the constructor itself sends COMMAND).
    rounds: Retry = Retry(redis.backoff.NoBackoff(), 0)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        once: Callable[..., Any] = redis.cluster.RedisCluster.execute_command
        return self.rounds.call_with_retry(lambda: once(self, *args, **kwargs), _nothing)


class AsyncCluster(redis.asyncio.cluster.RedisCluster):
    """:class:`SyncCluster` for asyncio."""

    rounds: AsyncRetry = AsyncRetry(redis.backoff.NoBackoff(), 0)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        once = redis.asyncio.cluster.RedisCluster.execute_command
        return await self.rounds.call_with_retry(lambda: once(self, *args, **kwargs), _anothing)


def _nothing(error: Exception) -> None:
    """A failed round needs no clean-up: redis-py re-read the slot map already."""


async def _anothing(error: Exception) -> None:
    """:func:`_nothing` for asyncio."""


def _built(make: Callable[..., Any], config: Config, **options: Any) -> Any:
    """A cluster client from the URL and the nodes seen so far. A seed that cannot be
    reached at all is a ConnectionError (a RedisError, as any other client's); a seed
    that is no cluster node is redis-py's RedisClusterException, which says so."""
    # The URL's node first (redis-py would try it last): a node remembered from before
    # may be gone, its port another server's since.
    named = redis.connection.parse_url(config.redis_url)
    first = (str(named.get("host", "localhost")), int(named.get("port", 6379)))
    known = [first, *sorted(_seen.get(config.redis_url, set()) - {first})]
    startup = [redis.cluster.ClusterNode(host, port) for host, port in known]
    try:
        return make(config.redis_url, startup_nodes=startup, **options)
    except redis.exceptions.RedisClusterException as exc:
        if "not enabled" in str(exc):
            raise  # CLUSTER set for a server that is not a cluster node
        raise redis.exceptions.ConnectionError(
            f"no node of the Redis Cluster answered: {exc}"
        ) from exc


def sync_cluster(config: Config, fail_fast: bool, options: dict[str, Any]) -> redis.Redis:
    """A sync cluster client. Typed as the plain client: every call the core makes on a
    store client exists on both with the same meaning, and ``keys`` keeps each call in
    one slot."""
    client: Any = _built(SyncCluster.from_url, config, retry=_IN_ROUND, **options)
    client.rounds = _rounds(Retry, fail_fast, config.redis_retry_s)
    remember(client, config)
    return client  # type: ignore[no-any-return]


def async_cluster(config: Config, fail_fast: bool, options: dict[str, Any]) -> redis.asyncio.Redis:
    """An asyncio cluster client, typed as :func:`sync_cluster`'s is."""
    client: Any = _built(AsyncCluster.from_url, config, retry=_IN_ROUND, **options)
    client.rounds = _rounds(AsyncRetry, fail_fast, config.redis_retry_s)
    return client  # type: ignore[no-any-return]


def remember(client: Any, config: Config) -> None:
    """Note the nodes ``client`` knows, for the clients of ``config`` built after it."""
    nodes = {(str(node.host), int(node.port)) for node in client.get_nodes()}
    _seen.setdefault(config.redis_url, set()).update(nodes)


def refresh(client: Any, config: Config) -> None:
    """Re-read the slot map now (``CLUSTER SLOTS``): after a failover, a process that
    made no keyed call since still holds the old map, in which a dead master serves."""
    client.nodes_manager.initialize()
    remember(client, config)


def master_of(client: Any, key: str) -> tuple[str, int]:
    """The address of the master that serves ``key``'s slot, by the client's slot map."""
    node = client.get_node_from_key(key)
    return str(node.host), int(node.port)
