"""Celery's broker as relier needs it: a durable Redis (or the store's own), RabbitMQ's
queues and publisher confirms, and relier's transport."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.connection
from celery import current_app
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Info, register
from django.core.checks import Warning as CheckWarning

from ..core.broker.redis_channel import SentinelTransport, Transport
from ..core.model.config import Config
from ..core.store.connection import redact, sync_client
from .common import LOOPBACK, TAG, unverifiable
from .settings import _settings
from .store import _cluster_error, _cluster_mode, _durability, _server_settings


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
        return [unverifiable(where, f"CONFIG GET and INFO were both refused ({server})")]
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
        return ("local" if host in LOOPBACK else host, int(kw.get("port") or 6379))

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


#: kombu's Redis transport options that only a site tuning kombu's inverted priorities sets.
_INVERTED_PRIORITY_OPTIONS = ("priority_steps", "queue_order_strategy")


@register(TAG)
def check_redis_priorities(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.W011: a Redis broker whose transport options tune kombu's priorities
    (``priority_steps``, ``queue_order_strategy``), where priority 0 is taken first;
    relier takes 9 first on every broker, so the site's priorities run the other way.

    Returns:
        At most one warning.
    """
    celery_conf = current_app.conf
    url = str(celery_conf.broker_url or "").split(";", 1)[0].strip()
    if urlsplit(url).scheme not in ("redis", "rediss", "sentinel", "redis+socket"):
        return []
    options = celery_conf.broker_transport_options or {}
    tuned = [name for name in _INVERTED_PRIORITY_OPTIONS if name in options]
    if not tuned:
        return []
    return [
        CheckWarning(
            f"Celery's broker options set {' and '.join(tuned)}, which tune kombu's Redis "
            "priorities, where priority 0 is taken first. relier_django takes the highest "
            "first on every broker (9 before 0, as RabbitMQ and django.tasks do), so "
            "priorities written for kombu's Redis now run in reverse.",
            hint="Turn each priority p into 9 - p (apply_async(priority=0) becomes "
            "priority=9), then remove "
            f"{', '.join(repr(name) for name in tuned)} from "
            "CELERY_BROKER_TRANSPORT_OPTIONS (relier's transport has a list per level); "
            "docs/from-celery.md.",
            id="relier.W011",
        )
    ]
