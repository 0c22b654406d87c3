"""relier's Redis: reachable, durable (AOF, no eviction), laid out as configured, a Redis
Cluster when ``CLUSTER`` says so, and death detection by connection."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.connection
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning

from ..core.model import links
from ..core.model.config import Config
from ..core.store import layout
from ..core.store.connection import describe, home_client, master_clients, redact, sync_client
from ..core.store.keys import KeySpace
from .common import OPT_OUT, TAG, unreachable, unverifiable
from .settings import _settings


@register(TAG)
def check_redis(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.W001 (unreachable), relier.E014 (a Redis Cluster node), relier.W006
    (``CLIENT LIST`` refused: deaths are then found by heartbeat expiry only), then,
    unless ``ALLOW_UNSAFE_REDIS``: relier.E003
    (AOF off), relier.E004 (an evicting maxmemory-policy), relier.W004 (``appendfsync
    no``) and relier.W002 (none of that could be read).

    Returns:
        The messages, empty for a reachable, durable, non-evicting server.
    """
    found = _settings()
    if found is None:
        return []
    cfg, django_settings = found
    where = describe(cfg)  # the redacted URL, or the Sentinel master and sentinels
    try:
        client = sync_client(cfg, fail_fast=True)
        client.ping()
        if not cfg.cluster and _cluster_mode(client):
            return [_cluster_error(where, "relier's store")]
        # On a cluster, each master keeps its own partitions: each must be durable.
        servers = _masters(cfg, client) if cfg.cluster else [(where, client)]
        messages = [*_layout(where, client, cfg), *_death_detection(where, home_client(cfg))]
        if django_settings.allow_unsafe_redis:
            return messages
        for at, server_client in servers:
            server = _server_settings(server_client)
            if isinstance(server, redis.exceptions.ResponseError):
                messages.append(
                    unverifiable(at, f"CONFIG GET and INFO were both refused ({server})")
                )
            else:
                messages += _durability(at, server)
    except ValueError:
        return []  # a malformed URL: relier.E001 reports it
    except redis.exceptions.RedisClusterException as exc:  # not a RedisError
        return [_not_a_cluster(where, exc)]
    except redis.exceptions.RedisError as exc:  # refused, timed out, or PING not allowed
        return [unreachable(where, exc)]
    return messages


def _masters(cfg: Config, client: Any) -> list[tuple[str, redis.Redis]]:
    """Each master of the store's Redis Cluster, as (how a message names it, a client)."""
    return [
        (f"{redact(cfg.redis_url)} (cluster master {host}:{port})", master)
        for (host, port), master in master_clients(cfg, client)
    ]


def _layout(where: str, client: redis.Redis, cfg: Config) -> list[CheckMessage]:
    """relier.E015: the store was laid out for other PARTITIONS or CLUSTER settings."""
    keys = KeySpace.of(cfg)
    recorded = layout.mismatch(client, keys)
    if recorded is None:
        return []
    return [
        Error(
            f"The store at {where} was laid out for {layout.describe(recorded)}, and these "
            f"settings give {layout.describe(keys.layout_value())}: this process would "
            "look for every task in the wrong place, and workers configured so refuse to "
            "start.",
            hint="Set PARTITIONS and CLUSTER as the store's other processes have them; a "
            f"store's partitions are fixed for its life ({links.doc('scaling.md')}).",
            id="relier.E015",
        )
    ]


def _not_a_cluster(where: str, exc: Exception) -> CheckMessage:
    return Error(
        f"RELIER['CLUSTER'] is set, but Redis at {where} is not a usable Redis Cluster "
        f"node ({exc}).",
        hint="Point REDIS_URL at a node of the cluster, or unset CLUSTER for a single "
        f"Redis ({links.doc('scaling.md')}).",
        id="relier.E016",
    )


def _cluster_mode(client: redis.Redis) -> bool:
    """Whether the server is a Redis Cluster node (``cluster_enabled:1``): one that
    refuses a script or command whose keys lie in more than one hash slot."""
    try:
        return bool(int(client.info("cluster").get("cluster_enabled", 0)))
    except redis.exceptions.ResponseError:
        return False  # INFO refused: a cluster node would have failed PING's neighbours


def _cluster_error(where: str, role: str) -> CheckMessage:
    if role == "relier's store":
        return Error(
            f"Redis at {where} is a Redis Cluster node (cluster_enabled:1), and relier's "
            "settings do not say so: its scripts would touch keys of several hash slots, "
            "which a cluster refuses (CROSSSLOT).",
            hint="Set RELIER['CLUSTER'] = True, and PARTITIONS to a multiple of the "
            f"cluster's masters ({links.doc('scaling.md')}).",
            id="relier.E014",
        )
    return Error(
        f"Redis at {where} is a Redis Cluster node (cluster_enabled:1): {role} cannot use "
        "it, since kombu's Redis transport does not support Redis Cluster.",
        hint="Point Celery's broker at a Redis that is not in cluster mode (on a managed "
        "service: 'cluster mode disabled'), with replicas and Sentinel for failover "
        f"({links.doc('operations.md')}), or at RabbitMQ.",
        id="relier.E014",
    )


def _death_detection(where: str, client: redis.Redis) -> list[CheckMessage]:
    """relier.W006: the scanners list the live processes' connections with CLIENT LIST
    (recovery/deaths.py); a server that refuses it leaves only the heartbeat TTL."""
    try:
        client.client_list(_type="pubsub")
    except redis.exceptions.ResponseError as exc:
        return [
            CheckWarning(
                f"Redis at {where} refuses CLIENT LIST ({exc}): a dead worker's tasks are "
                "then found only when their heartbeats expire (HEARTBEAT_TTL_S), not "
                "within about a second of its death.",
                hint="Allow the 'client' command (CLIENT LIST) for relier's Redis user, "
                "e.g. ACL SETUSER <user> +client|list; or accept TTL-bound recovery and "
                "add 'relier.W006' to SILENCED_SYSTEM_CHECKS.",
                id="relier.W006",
            )
        ]
    return []


def _server_settings(client: redis.Redis) -> dict[str, str] | redis.exceptions.ResponseError:
    """appendonly, appendfsync and maxmemory-policy, by CONFIG GET in one round trip.

    A managed Redis often renames or forbids CONFIG but answers INFO, which knows the
    first and the last (not appendfsync): that is the fallback. When both are refused,
    the refusal is returned for relier.W002.
    """
    try:
        pipe = client.pipeline(transaction=False)
        for name in ("appendonly", "appendfsync", "maxmemory-policy"):
            pipe.config_get(name)  # one name per call: Redis < 7 takes one pattern
        found: dict[str, str] = {}
        for reply in pipe.execute():
            found.update(reply)
        return found
    except redis.exceptions.ResponseError:
        pass
    try:
        persistence = client.info("persistence")
        memory = client.info("memory")
    except redis.exceptions.ResponseError as exc:
        return exc
    found = {}
    if "aof_enabled" in persistence:
        found["appendonly"] = "yes" if int(persistence["aof_enabled"]) else "no"
    if "maxmemory_policy" in memory:
        found["maxmemory-policy"] = str(memory["maxmemory_policy"])
    return found


def _durability(
    where: str, server: Mapping[str, str], broker_grace_s: float | None = None
) -> Iterable[CheckMessage]:
    """The durability rules, for relier's store or (``broker_grace_s`` given: its
    queued grace) for Celery's broker, where a lost message costs relier's tasks the
    grace and plain Celery tasks their run."""
    if broker_grace_s is None:
        lost = (
            "loses every task pushed since the last snapshot (all of them, with snapshots "
            "off), which breaks relier's promise that a pushed task runs or lands in the "
            "dead-letter queue"
        )
        evicted = "an evicted envelope, heartbeat or fence is a lost or duplicated task"
    else:
        late = f"relier's tasks in it run only after QUEUED_GRACE_S ({broker_grace_s:g} s)"
        lost = (
            "loses every message queued since the last snapshot: "
            f"{late}, and plain Celery tasks are lost"
        )
        evicted = f"an evicted queue or message is a task lost to Celery; {late}"
    appendonly = server.get("appendonly")
    if appendonly is not None and appendonly != "yes":
        yield Error(
            f"Redis at {where} runs without AOF (appendonly is {appendonly!r}): a restart {lost}.",
            hint="In redis.conf: 'appendonly yes' and 'appendfsync everysec' (on a running "
            "server: CONFIG SET appendonly yes, CONFIG SET appendfsync everysec, then CONFIG "
            f"REWRITE). {OPT_OUT}.",
            id="relier.E003",
        )
    elif server.get("appendfsync") == "no":
        yield CheckWarning(
            f"Redis at {where} has appendfsync 'no': the OS decides when the AOF reaches the "
            "disk (typically every 30 s), so a crash can lose that many seconds of "
            f"{'pushes' if broker_grace_s is None else 'messages'} instead of at most one.",
            hint="In redis.conf: 'appendfsync everysec' (on a running server: CONFIG SET "
            f"appendfsync everysec, then CONFIG REWRITE). {OPT_OUT}.",
            id="relier.W004",
        )
    policy = server.get("maxmemory-policy")
    if policy is not None and policy != "noeviction":
        yield Error(
            f"Redis at {where} has maxmemory-policy {policy!r}: when memory runs out it "
            f"evicts keys, and {evicted}.",
            hint="In redis.conf: 'maxmemory-policy noeviction' (on a running server: CONFIG "
            "SET maxmemory-policy noeviction, then CONFIG REWRITE); a full Redis then refuses "
            f"writes loudly instead. {OPT_OUT}.",
            id="relier.E004",
        )
    missing = {"appendonly", "maxmemory-policy"} - set(server)
    if missing:
        yield unverifiable(where, f"the server did not report {' or '.join(sorted(missing))}")
