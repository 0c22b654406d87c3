"""System checks: relier's settings, its Redis server, Celery's settings and the tasks.

Registered from ``RelierConfig.ready()`` under the tag ``relier``, so they run with
every ``manage.py check`` (and every command that runs checks) and can be selected
alone with ``manage.py check --tag relier``. docs/settings.md lists every id.

relier.W007 (an unknown ``RELIER_*`` environment variable) is a warning, not an
error: the variable may belong to something else that shares the prefix.

The Redis checks do I/O: one fail-fast client (about a one-second timeout, no
retries), a PING and one round trip of CONFIG GET (or INFO), so a missing Redis
delays a check by about a second, never more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.connection
from celery import current_app
from celery.app.routes import Router, prepare
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Info, register
from django.core.checks import Warning as CheckWarning
from django.core.exceptions import ImproperlyConfigured

from . import conf, discovery
from .core.broker.transport import SentinelTransport, Transport
from .core.model import links
from .core.model.config import Config
from .core.schedule import periodic, ticks
from .core.store import layout
from .core.store.connection import describe, home_client, master_clients, redact, sync_client
from .core.store.keys import KeySpace
from .core.task import RelierTask

TAG = "relier"
"""The check tag: ``manage.py check --tag relier`` runs only these checks."""

_OPT_OUT = "RELIER['ALLOW_UNSAFE_REDIS'] = True silences this on a development server"
_PICKLE = ("pickle", "application/x-python-serialize")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def _settings() -> tuple[Config, conf.DjangoSettings] | None:
    # None when the settings are invalid: relier.E001/E002 report that once, and the
    # other checks have nothing sound to check against.
    try:
        return conf.get_config(), conf.get_django_settings()
    except ImproperlyConfigured:
        return None


@register(TAG)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E001 (settings that cannot work: one error per bad key or value) and
    relier.E002 (heartbeat refresh not below the TTL), instead of an
    ``ImproperlyConfigured`` traceback.

    Returns:
        The errors, empty for settings that load.
    """
    hint = (
        "Correct the setting named above in settings.RELIER, or in its RELIER_<NAME> "
        f"environment variable (which wins over the dict); {links.doc('settings.md')} lists "
        "every setting with its type and default."
    )
    try:
        cfg = conf.get_config()
    except ImproperlyConfigured as exc:
        problems = exc.problems if isinstance(exc, conf.SettingsError) else (str(exc),)
        heartbeat = _heartbeat_error()
        found = [] if heartbeat is None else [heartbeat]
        if heartbeat is not None:  # E002 says it better than Config's own sentence
            problems = tuple(p for p in problems if "below heartbeat_ttl_s" not in p)
        return found + [Error(problem, hint=hint, id="relier.E001") for problem in problems]
    try:
        # What every client does with it: a wrong scheme, a port that is not a number,
        # a bad query option all fail here (check_redis leaves them to this check).
        redis.connection.parse_url(cfg.redis_url)
    except ValueError as exc:
        return [
            Error(
                f"REDIS_URL {redact(cfg.redis_url)!r} is not a usable redis://, rediss:// or "
                f"unix:// URL: {exc}",
                hint="Set RELIER['REDIS_URL'] (or RELIER_REDIS_URL) to e.g. "
                "redis://127.0.0.1:6379/0.",
                id="relier.E001",
            )
        ]
    return []


def _heartbeat_error() -> CheckMessage | None:
    # Config refuses this too, but with field names; the check explains it in settings'
    # terms and proposes the value.
    try:
        values = conf.config_values()
    except ImproperlyConfigured:
        return None
    ttl = values.get("heartbeat_ttl_s", Config.__dataclass_fields__["heartbeat_ttl_s"].default)
    interval = values.get("heartbeat_interval_s")
    if interval is None or ttl <= 0 or interval < ttl:
        return None
    return Error(
        f"HEARTBEAT_INTERVAL_S ({interval:g}) is not below HEARTBEAT_TTL_S ({ttl:g}): a "
        "running task's heartbeat would expire between two refreshes, and the task would "
        "be resurrected while it still runs.",
        hint=f"Set HEARTBEAT_INTERVAL_S below {ttl:g}, e.g. {ttl / 3:g} (a third of the TTL, "
        "what you get when it is unset), in settings.RELIER or RELIER_HEARTBEAT_INTERVAL_S.",
        id="relier.E002",
    )


@register(TAG)
def check_environment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.W007: a ``RELIER_*`` environment variable that names no setting.

    Returns:
        One warning per such variable.
    """
    return [
        CheckWarning(
            f"{problem[0].upper()}{problem[1:]}: it is ignored, and the setting it was meant "
            "to change keeps its value.",
            hint=f"Correct its name ({links.doc('settings.md')} lists every setting; the "
            "variable is RELIER_ and the setting's name), or unset it; or add 'relier.W007' "
            "to SILENCED_SYSTEM_CHECKS if another program owns it.",
            id="relier.W007",
        )
        for problem in conf.unknown_environment()
    ]


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
                    _unverifiable(at, f"CONFIG GET and INFO were both refused ({server})")
                )
            else:
                messages += _durability(at, server)
    except ValueError:
        return []  # a malformed URL: relier.E001 reports it
    except redis.exceptions.RedisClusterException as exc:  # not a RedisError
        return [_not_a_cluster(where, exc)]
    except redis.exceptions.RedisError as exc:  # refused, timed out, or PING not allowed
        return [_unreachable(where, exc)]
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


def _unreachable(where: str, exc: Exception) -> CheckMessage:
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return CheckWarning(
            f"Redis at {where} refused relier's credentials ({exc}); its persistence and "
            "eviction settings were not checked.",
            hint="Correct the user or password in RELIER['REDIS_URL'] (or RELIER_REDIS_URL, "
            "which wins). Until Redis accepts them, push() fails and workers refuse to start.",
            id="relier.W001",
        )
    return CheckWarning(
        f"Redis at {where} is unreachable: it did not answer a PING ({exc}); its "
        "persistence and eviction settings were not checked.",
        hint="Start that Redis, or point RELIER['REDIS_URL'] (or RELIER_REDIS_URL, which "
        "wins) at the right one. Until it answers, push() fails and workers refuse to start.",
        id="relier.W001",
    )


def _unverifiable(where: str, why: str) -> CheckMessage:
    return CheckWarning(
        f"Could not verify the persistence and eviction settings of Redis at {where}: {why}.",
        hint="Make sure the server runs with appendonly yes, appendfsync everysec and "
        "maxmemory-policy noeviction (on a managed Redis: its parameter group), then add "
        "'relier.W002' to SILENCED_SYSTEM_CHECKS; or grant this user CONFIG GET or INFO.",
        id="relier.W002",
    )


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
            f"REWRITE). {_OPT_OUT}.",
            id="relier.E003",
        )
    elif server.get("appendfsync") == "no":
        yield CheckWarning(
            f"Redis at {where} has appendfsync 'no': the OS decides when the AOF reaches the "
            "disk (typically every 30 s), so a crash can lose that many seconds of "
            f"{'pushes' if broker_grace_s is None else 'messages'} instead of at most one.",
            hint="In redis.conf: 'appendfsync everysec' (on a running server: CONFIG SET "
            f"appendfsync everysec, then CONFIG REWRITE). {_OPT_OUT}.",
            id="relier.W004",
        )
    policy = server.get("maxmemory-policy")
    if policy is not None and policy != "noeviction":
        yield Error(
            f"Redis at {where} has maxmemory-policy {policy!r}: when memory runs out it "
            f"evicts keys, and {evicted}.",
            hint="In redis.conf: 'maxmemory-policy noeviction' (on a running server: CONFIG "
            "SET maxmemory-policy noeviction, then CONFIG REWRITE); a full Redis then refuses "
            f"writes loudly instead. {_OPT_OUT}.",
            id="relier.E004",
        )
    missing = {"appendonly", "maxmemory-policy"} - set(server)
    if missing:
        yield _unverifiable(where, f"the server did not report {' or '.join(sorted(missing))}")


@register(TAG)
def check_broker_redis(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """The rules of :func:`check_redis` for Celery's broker when it is another Redis
    server than relier's store: relier.W001, relier.E014, then, unless
    ``ALLOW_UNSAFE_REDIS``, relier.E003, relier.E004, relier.W004 and relier.W002, each
    naming the broker.

    A message the broker loses is a relier task that waits ``QUEUED_GRACE_S`` and a
    plain Celery task that never runs.

    Returns:
        The messages, empty when the broker is not Redis, is relier's own server, or is
        durable.
    """
    found = _settings()
    if found is None:
        return []
    cfg, django_settings = found
    url = str(current_app.conf.broker_url or "").split(";", 1)[0].strip()
    if urlsplit(url).scheme not in ("redis", "rediss", "unix") or _same_server(url, cfg):
        return []  # not Redis (sentinel:// too: its master moves), or check_redis's
    where = f"{redact(url)} (Celery's broker)"
    try:
        broker = cfg.replace(
            redis_url=url, sentinels=(), sentinel_master=None, cluster=False, partitions=1
        )
        client = sync_client(broker, fail_fast=True)
        client.ping()
        if _cluster_mode(client):
            return [_cluster_error(where, "Celery's broker")]
        if django_settings.allow_unsafe_redis:
            return []
        server = _server_settings(client)
    except ValueError:
        return []  # a URL redis-py cannot parse: Celery reports it when it connects
    except redis.exceptions.RedisError as exc:
        return [
            CheckWarning(
                f"Celery's broker at {redact(url)} is unreachable: it did not answer a "
                f"PING ({exc}); its persistence and eviction settings were not checked.",
                hint="Start that Redis, or correct CELERY_BROKER_URL. Until it answers, "
                "push() fails and workers receive nothing.",
                id="relier.W001",
            )
        ]
    if isinstance(server, redis.exceptions.ResponseError):
        return [_unverifiable(where, f"CONFIG GET and INFO were both refused ({server})")]
    return list(_durability(where, server, broker_grace_s=cfg.queued_grace_s))


def _same_server(url: str, cfg: Config) -> bool:
    """Whether ``url`` names the server of relier's store (any database of it)."""
    if cfg.sentinels:
        return False  # the store's master is found through the sentinels
    try:
        ours = redis.connection.parse_url(cfg.redis_url)
        theirs = redis.connection.parse_url(url)
    except ValueError:
        return False

    def where(kw: Mapping[str, Any]) -> tuple[object, ...]:
        if "path" in kw:
            return ("unix", kw["path"])
        host = kw.get("host") or "localhost"
        return ("local" if host in _LOOPBACK else host, int(kw.get("port") or 6379))

    return where(ours) == where(theirs)


@register(TAG)
def check_rabbitmq(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """For a RabbitMQ broker (``amqp://``): relier.W008 (publishes without publisher
    confirms) and relier.W009 (quorum queues with a delivery limit).

    Returns:
        The warnings, empty for another broker or a RabbitMQ set up as relier needs.
    """
    found = _settings()
    if found is None:
        return []
    cfg = found[0]
    celery_conf = current_app.conf
    url = str(celery_conf.broker_url or "").split(";", 1)[0].strip()
    if urlsplit(url).scheme not in ("amqp", "amqps", "pyamqp"):
        return []
    late = f"QUEUED_GRACE_S ({cfg.queued_grace_s:g} s)"
    messages: list[CheckMessage] = []
    if not (celery_conf.broker_transport_options or {}).get("confirm_publish"):
        messages.append(
            CheckWarning(
                "Celery publishes to RabbitMQ without publisher confirms: push() returns "
                "before the broker has the message, so a message lost with a node or a "
                f"connection leaves its task to run only after {late}.",
                hint='Set CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}: '
                "push() then returns once RabbitMQ has the message.",
                id="relier.W008",
            )
        )
    limited = _quorum_queues_with_a_delivery_limit(celery_conf)
    if limited:
        messages.append(
            CheckWarning(
                f"The quorum queue(s) {', '.join(limited)} drop a message redelivered more "
                "times than their delivery limit (20 unless set, since RabbitMQ 4.0), "
                f"without a word: its task then waits {late} until relier re-dispatches "
                "it from its stored copy.",
                hint="Give each queue 'x-delivery-limit': -1 in its queue_arguments (or a "
                "RabbitMQ policy with delivery-limit -1, RabbitMQ 4.0+), so only relier "
                "decides when a task stops: its retries, resurrections and DLQ.",
                id="relier.W009",
            )
        )
    return messages


def _quorum_queues_with_a_delivery_limit(celery_conf: Any) -> list[str]:
    declared = celery_conf.task_queues
    queues = list(declared.values() if isinstance(declared, Mapping) else declared or ())
    limited = []
    for queue in queues:
        arguments = getattr(queue, "queue_arguments", None) or {}
        if arguments.get("x-queue-type") == "quorum" and arguments.get("x-delivery-limit") != -1:
            limited.append(repr(getattr(queue, "name", queue)))
    if not queues and celery_conf.task_default_queue_type == "quorum":
        limited.append(repr(celery_conf.task_default_queue))  # Celery declares it bare
    return limited


@register(TAG)
def check_celery_serializers(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E005: Celery configured to send or accept pickle.

    Returns:
        One error per offending Celery setting.
    """
    celery_conf = current_app.conf
    errors: list[CheckMessage] = []
    risk = (
        "a worker that accepts pickle runs whatever code anyone who can write to the broker "
        "sends it; relier's envelopes are JSON and need nothing else."
    )
    for name in ("task_serializer", "result_serializer"):
        if celery_conf.get(name) in _PICKLE:
            errors.append(
                Error(
                    f"Celery's {name} is {celery_conf.get(name)!r}: {risk}",
                    hint=f"Set {name} = 'json' (CELERY_{name.upper()} = 'json' in Django "
                    "settings, with the usual CELERY namespace).",
                    id="relier.E005",
                )
            )
    for name in ("accept_content", "result_accept_content"):
        accepted = list(celery_conf.get(name) or ())
        if any(kind in _PICKLE for kind in accepted):
            kept = [kind for kind in accepted if kind not in _PICKLE] or ["json"]
            errors.append(
                Error(
                    f"Celery's {name} {accepted!r} includes pickle: {risk}",
                    hint=f"Set {name} = {kept!r} (CELERY_{name.upper()} in Django settings, "
                    "with the usual CELERY namespace).",
                    id="relier.E005",
                )
            )
    return errors


@register(TAG)
def check_broker_transport(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E007: relier_django's transport for the wrong kind of broker URL;
    relier.I001: kombu's own Redis transport, where relier_django's would save each
    task kombu's two ack-emulation round trips.

    Returns:
        At most one message.
    """
    from kombu.transport import get_transport_cls
    from kombu.transport import redis as kombu_redis

    celery_conf = current_app.conf
    url = str(celery_conf.broker_url or "").split(";", 1)[0]
    scheme = url.split("://", 1)[0] if "://" in url else ""
    name = celery_conf.broker_transport or scheme
    try:
        cls = get_transport_cls(name) if isinstance(name, str) else name
    except Exception:  # an unknown transport: Celery itself says so
        return []
    wanted = SentinelTransport if scheme == "sentinel" else Transport
    setting = f'CELERY_BROKER_TRANSPORT = "relier_django.transport:{wanted.__name__}"'
    if cls in (Transport, SentinelTransport):
        if cls is wanted:
            return []
        return [
            Error(
                f"Celery's broker transport is relier_django's {cls.__name__}, which is "
                f"for {'sentinel' if cls is SentinelTransport else 'redis'}:// URLs, but "
                f"the broker URL is {redact(url)!r}: the worker would not reach its broker.",
                hint=f"Set {setting}.",
                id="relier.E007",
            )
        ]
    if cls in (kombu_redis.Transport, kombu_redis.SentinelTransport):
        return [
            Info(
                "Celery's broker is kombu's own Redis transport: each relier_django task "
                "pays kombu's ack emulation (an unacked copy written on delivery and deleted "
                "on ack, two round trips), which relier_django's heartbeats make redundant.",
                hint=f"Set {setting} (every other task keeps kombu's ack emulation).",
                id="relier.I001",
            )
        ]
    return []


def _relier_tasks() -> list[RelierTask]:
    discovery.import_task_modules()
    return [task for task in current_app.tasks.values() if isinstance(task, RelierTask)]


@register(TAG)
def check_task_imports(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E013: a module in Celery's ``imports`` or ``include`` that cannot be
    imported: a worker would not start, and the task checks cannot see its tasks.

    Returns:
        One error per such module.
    """
    return [
        Error(
            f"The module {name!r} in Celery's imports (CELERY_IMPORTS or "
            f"CELERY_INCLUDE) cannot be imported: {type(exc).__name__}: {exc}.",
            hint="Correct the module path, or the error in the module; a worker fails to "
            "start on it too.",
            id="relier.E013",
        )
        for name, exc in discovery.import_task_modules()
    ]


@register(TAG)
def check_task_timeouts(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E006: a task whose soft timeout is not below its hard timeout.

    ``@rl_task`` already refuses this; the check covers specs built another way.

    Returns:
        One error per such task.
    """
    errors: list[CheckMessage] = []
    for task in _relier_tasks():
        spec = task.relier_spec
        soft, hard = spec.soft_timeout_s, spec.hard_timeout_s
        if soft is not None and hard is not None and soft >= hard:
            errors.append(
                Error(
                    f"Task {task.name!r} has soft_timeout ({soft:g} s) >= hard_timeout "
                    f"({hard:g} s): its on_soft_timeout hook would never run before the "
                    "hard stop.",
                    hint=f"Give {task.name} a soft_timeout below its hard_timeout, e.g. "
                    f"@rl_task(soft_timeout={hard * 0.8:g}, hard_timeout={hard:g}), or drop "
                    "soft_timeout.",
                    id="relier.E006",
                )
            )
    return errors


@register(TAG)
def check_task_queues(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.W003: a task published to a queue that no worker consumes.

    A task's queue is its ``@rl_task(queue=)``, else Celery's ``task_routes`` for its
    name, else ``task_default_queue``. The consumed queues are ``WORKER_QUEUES`` when set,
    else the names in Celery's ``task_queues``, else ``task_default_queue``; the recovery
    queue always counts, since every worker consumes it. A route given by a function
    that needs the task's arguments cannot be followed, and is not reported.

    Returns:
        One warning per task whose queue no worker consumes.
    """
    found = _settings()
    if found is None:
        return []
    cfg, django_settings = found
    app = current_app
    consumed, source, fix = _consumed_queues(app.conf, django_settings)
    consumed.add(cfg.recovery_queue)
    router = Router(routes=prepare(app.conf.task_routes), app=app)
    warnings: list[CheckMessage] = []
    for task in _relier_tasks():
        queue = _task_queue(router, task.relier_spec.queue, task.name, app.conf)
        if queue is None or queue in consumed:
            continue
        warnings.append(
            CheckWarning(
                f"Task {task.name!r} is published to the queue {queue!r}, which no worker "
                f"consumes according to {source} ({', '.join(sorted(consumed))}): each "
                f"push would wait QUEUED_GRACE_S ({cfg.queued_grace_s:g} s) until the "
                "resurrector re-dispatches it to the recovery queue.",
                hint=f"Run a worker with -Q {queue} and {fix(queue)}; or route the task to a "
                "consumed queue.",
                id="relier.W003",
            )
        )
    return warnings


@register(TAG)
def check_periodic_schedule(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E008 (a ``beat_schedule`` entry naming no registered task), relier.E009 (a
    schedule that is not seconds, a ``timedelta`` or a ``crontab``, or an interval that
    is infinite, NaN, not above 0 or above 100 years), relier.E010 (an
    entry relier cannot push: its args, kwargs or options), relier.W005 (an entry for a
    plain Celery task: relier does not fire it, celery beat must run for it).

    Returns:
        One message per entry relier's scanners will not fire.
    """
    discovery.import_task_modules()  # as _relier_tasks: the check sees every task
    _, rejected = periodic.read_entries(current_app)
    where = "Celery's beat_schedule (CELERY_BEAT_SCHEDULE)"
    messages: list[CheckMessage] = []
    for bad in rejected:
        entry = f"Periodic entry {bad.entry!r} in {where}"
        if bad.problem is periodic.Problem.NOT_RELIER:
            messages.append(CheckWarning(
                f"{entry} names a plain Celery task ({bad.detail}): relier's scanners fire "
                "only @rl_task entries, so this one runs only while celery beat runs.",
                hint="Run one `celery -A <proj> beat` for it (and only one), or make the task "
                f"an @rl_task so relier fires it exactly once; {links.doc('scheduling.md')}.",
                id="relier.W005",
            ))  # fmt: skip
        elif bad.problem is periodic.Problem.UNKNOWN_TASK:
            messages.append(Error(
                f"{entry}: {bad.detail}; it would never fire.",
                hint="Correct its 'task' to a registered task name (the @rl_task's `name=`, "
                "or its module path and function name), or remove the entry.",
                id="relier.E008",
            ))  # fmt: skip
        elif bad.problem is periodic.Problem.BAD_SCHEDULE:
            messages.append(Error(
                f"{entry}: its 'schedule' {bad.detail}.",
                hint="Give 'schedule' a finite number of seconds > 0 and at most 100 years "
                "(e.g. 30.0), a datetime.timedelta, or a celery.schedules.crontab(...).",
                id="relier.E009",
            ))  # fmt: skip
        else:
            messages.append(Error(
                f"{entry} cannot be pushed: {bad.detail}.",
                hint="Give the entry 'args' (a list) and 'kwargs' (a dict) that fit the "
                "task's signature, and 'options' a dict whose "
                f"'{periodic.MISSED_OPTION}' is one of "
                f"{', '.join(repr(m.value) for m in ticks.Missed)}.",
                id="relier.E010",
            ))  # fmt: skip
    return messages


def _consumed_queues(
    celery_conf: Any, django_settings: conf.DjangoSettings
) -> tuple[set[str], str, Callable[[str], str]]:
    """The queues workers consume, where that was read from, and how to add one."""
    if django_settings.worker_queues is not None:
        return (
            set(django_settings.worker_queues),
            "RELIER['WORKER_QUEUES']",
            lambda q: f"add {q!r} to RELIER['WORKER_QUEUES']",
        )
    declared = celery_conf.task_queues
    if declared:
        names = declared.keys() if isinstance(declared, Mapping) else map(_queue_name, declared)
        return (
            {name for name in names if name},
            "Celery's task_queues",
            lambda q: (
                f"declare {q!r} in Celery's task_queues (or list your workers' -Q "
                "queues in RELIER['WORKER_QUEUES'])"
            ),
        )
    return (
        {celery_conf.task_default_queue},
        "Celery's task_default_queue (task_queues is not set)",
        lambda q: (
            f"list your workers' -Q queues in RELIER['WORKER_QUEUES'] (or declare "
            f"{q!r} in Celery's task_queues)"
        ),
    )


def _queue_name(queue: Any) -> str | None:
    if isinstance(queue, str):
        return queue
    name = getattr(queue, "name", None)  # a kombu.Queue
    return name if isinstance(name, str) else None


def _task_queue(router: Router, own: str | None, name: str, celery_conf: Any) -> str | None:
    """The queue ``push()`` publishes the task to; None when it depends on arguments."""
    if own:
        return own
    try:
        route = router.lookup_route(name, (), {}, {}, None)
    except Exception:  # a router function may need real arguments: then we cannot tell
        return None
    if route is None:
        return str(celery_conf.task_default_queue)
    if isinstance(route, Mapping):
        return _queue_name(route.get("queue"))
    return _queue_name(route)
