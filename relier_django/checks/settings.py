"""relier's settings and its ``RELIER_*`` environment variables (``relier.E001``, ``W007``,
the heartbeat's bounds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.connection
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning
from django.core.exceptions import ImproperlyConfigured

from .. import conf
from ..core.model import links
from ..core.model.config import Config
from ..core.store.connection import redact
from .common import TAG


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
