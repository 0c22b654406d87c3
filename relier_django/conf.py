"""The only module that reads Django settings or the environment.

``settings.RELIER`` (a dict, keys in upper case) and ``RELIER_*`` environment
variables become one frozen core ``Config`` plus a few
Django-level settings (:class:`DjangoSettings`) that the core never sees. An
environment variable wins over the settings dict, so one image can be reconfigured
per deployment. Both results are cached and dropped on ``setting_changed``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .core.model import config as core_config
from .core.model.errors import ConfigError

logger = logging.getLogger("relier_django.conf")
_ENV_PREFIX = "RELIER_"


class SettingsError(ConfigError, ImproperlyConfigured):
    """relier's settings cannot be loaded: every bad key and value, in one message.

    An ``ImproperlyConfigured`` to Django, and a core ``ConfigError``, which is how a
    worker (core code, which never imports Django) tells it from other failures.

    Attributes:
        problems: one message per bad key or value, each naming where it came from.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class DjangoSettings:
    """Keys of ``settings.RELIER`` read by the Django layer only (not core ``Config``)."""

    # The alias of a Django cache (django-redis or Django's RedisCache) whose server
    # relier uses instead of REDIS_URL: one place to configure Redis.
    redis_cache_alias: str | None = None
    # Development only: accept a Redis without AOF or with an evicting maxmemory-policy
    # (silences relier.E003, relier.E004, relier.W002 and relier.W004).
    allow_unsafe_redis: bool = False
    # The queues your workers consume (the union of their -Q options); unset: what
    # Celery's own settings imply. Only relier.W003 reads it.
    worker_queues: tuple[str, ...] | None = None
    # The Celery result backend (a URL, e.g. "redis://host:6379/1") that
    # relier_django.results.RelierBackend hands every id relier's store does not know
    # and every write (your other Celery tasks' results); unset: they are dropped.
    # It may hold a password: never echoed in an error (repr=False).
    result_backend_fallback: str | None = dataclasses.field(default=None, repr=False)
    # The bearer token the metrics endpoint (relier_django.urls) asks of a scraper;
    # unset: only staff sessions may read it. Never echoed (repr=False).
    metrics_token: str | None = dataclasses.field(default=None, repr=False)
    # The transactional outbox: a push inside atomic() also writes its envelope into
    # the relier_outbox table of that transaction's database (docs/transactions.md).
    outbox: bool = False
    # How old an outbox row must be before the relay sends it: longer than a
    # commit's own send takes, so the two rarely race (they are safe when they do).
    outbox_grace_s: float = 10.0
    # How long the fenced inbox keeps a committed unit's row (a zombie paused longer
    # than this could write again): docs/transactions.md.
    inbox_keep_s: float = 7 * 24 * 3600.0
    # django-celery-beat's enabled PeriodicTask rows that name an @rl_task are fired by
    # relier's scanners too, exactly once per tick (docs/scheduling.md).
    celery_beat_models: bool = False


DJANGO_KEYS: tuple[str, ...] = tuple(f.name.upper() for f in dataclasses.fields(DjangoSettings))
"""Keys of ``settings.RELIER`` that are not core ``Config`` fields."""

CONFIG_KEYS: tuple[str, ...] = tuple(name.upper() for name in core_config.FIELDS)
"""Keys of ``settings.RELIER`` that become core ``Config`` fields."""

# Backends whose LOCATION is a redis:// URL relier can connect to as it is.
_REDIS_CACHE_BACKENDS = (
    "django_redis.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache",
)
# django-redis client classes that talk to the single server named by LOCATION;
# ShardClient and SentinelClient do not, so their LOCATION is not relier's server.
_PLAIN_DJANGO_REDIS_CLIENTS = (
    "django_redis.client.DefaultClient",
    "django_redis.client.default.DefaultClient",
    "django_redis.client.HerdClient",
    "django_redis.client.herd.HerdClient",
)


def _is_optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _is_tuple(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple or any(
        typing.get_origin(arg) is tuple for arg in typing.get_args(hint)
    )


def _cast(hint: Any, raw: Any, source: str, secret: bool = False) -> Any:
    if _is_optional(hint) and (raw is None or raw == ""):
        return None
    shown = "a value that is not shown (a secret)" if secret else repr(raw)
    if _is_tuple(hint):
        return _cast_strings(raw, source, shown)
    base = {int: int, float: float, str: str, bool: bool}
    target = next((t for t in base if hint is t or t in typing.get_args(hint)), str)
    if raw is None:
        raise ImproperlyConfigured(f"{source} must be {_a(target)}, got None")
    if target is bool and isinstance(raw, str):
        return _cast_bool(raw, source)
    if not isinstance(raw, str) and not _fits(raw, target):
        # A value from the settings dict is taken as given, never coerced: 2.9 is not
        # silently 2 retries, ["a"] is not the prefix "['a']", [0] is not True.
        raise ImproperlyConfigured(f"{source} must be {_a(target)}, got {shown}")
    try:
        return target(raw)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{source} must be {_a(target)}, got {shown}") from exc


def _a(target: type) -> str:
    name = target.__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _fits(raw: Any, target: type) -> bool:
    if isinstance(raw, bool):
        return target is bool
    if target is float:
        return isinstance(raw, int | float)
    return isinstance(raw, target)


# The true words of django-environ's Env.bool (a settings file may read the same
# variables with it), and their opposites. Anything else is refused rather than read
# as False: a typo must not quietly turn a switch off (or on).
_TRUE_WORDS = ("true", "on", "ok", "y", "yes", "1")
_FALSE_WORDS = ("false", "off", "no", "n", "0")


def _cast_bool(raw: str, source: str) -> bool:
    word = raw.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise ImproperlyConfigured(
        f"{source} must be a bool (true/false, 1/0, yes/no, on/off), got {raw!r}"
    )


def _cast_strings(raw: Any, source: str, shown: str) -> tuple[str, ...]:
    # A list in the settings dict; comma-separated in the environment ("a, b"); a dict
    # in the settings dict becomes "key=value" entries ({"shop.charge": "100/s"}).
    if isinstance(raw, dict):
        # A nested dict ({"stripe": {"concurrency": 5}}, RELIER["LIMITS"]) as JSON.
        raw = [f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in raw.items()]
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ImproperlyConfigured(f"{source} must be a list of strings, got {shown}")
    return tuple(item.strip() for item in items if item.strip())


def _given() -> tuple[dict[str, Any], list[str]]:
    """``settings.RELIER``, and a problem per unknown key in it."""
    given = getattr(settings, "RELIER", None) or {}
    if not isinstance(given, dict):
        raise SettingsError([f"settings.RELIER must be a dict, got {type(given).__name__}"])
    known = sorted(CONFIG_KEYS + DJANGO_KEYS)
    return given, [_unknown(key, known) for key in sorted(map(str, set(given) - set(known)))]


def _unknown(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key.upper(), known, n=1)
    if close:
        return f"settings.RELIER has an unknown key {key!r} (did you mean {close[0]!r}?)"
    return f"settings.RELIER has an unknown key {key!r} (known keys: {', '.join(known)})"


def unknown_environment() -> list[str]:
    """One message per ``RELIER_*`` environment variable that names no setting.

    A misspelled variable (``RELIER_HEARTBEAT_TTL`` for ``RELIER_HEARTBEAT_TTL_S``) is
    otherwise ignored without a word, and the default it meant to change stays in force.
    """
    known = sorted(CONFIG_KEYS + DJANGO_KEYS)
    found = []
    for name in sorted(n for n in os.environ if n.startswith(_ENV_PREFIX)):
        key = name.removeprefix(_ENV_PREFIX)
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1)
        guess = f"did you mean {_ENV_PREFIX}{close[0]}?" if close else "no setting has that name"
        found.append(f"the environment variable {name} is not a relier setting ({guess})")
    return found


def _read(upper: str, given: dict[str, Any]) -> tuple[Any, str] | None:
    """The raw value of one setting and where it came from; the environment wins."""
    env_name = f"{_ENV_PREFIX}{upper}"
    if env_name in os.environ:
        return os.environ[env_name], f"the environment variable {env_name}"
    if upper in given:
        return given[upper], f"settings.RELIER[{upper!r}]"
    return None


def _read_typed(
    cls: type, given: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The fields of ``cls`` that were given, cast; their sources; a problem per value
    that could not be cast (all of them, not just the first)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    for field in dataclasses.fields(cls):
        found = _read(field.name.upper(), given)
        if found is not None:
            raw, sources[field.name] = found
            # Config marks its secrets repr=False; an error message must not echo them.
            secret = not field.repr
            try:
                values[field.name] = _cast(hints[field.name], raw, sources[field.name], secret)
            except ImproperlyConfigured as exc:
                problems.append(str(exc))
    return values, sources, problems


@functools.cache
def get_django_settings() -> DjangoSettings:
    """The Django-level settings (``REDIS_CACHE_ALIAS``, ``ALLOW_UNSAFE_REDIS``, ...).

    Raises:
        SettingsError: unknown keys in ``settings.RELIER``, or values of the wrong type
            (all of them); an ``ImproperlyConfigured``.
    """
    given, problems = _given()
    values, _, bad = _read_typed(DjangoSettings, given)
    if problems or bad:
        raise SettingsError(problems + bad)
    return DjangoSettings(**values)


def config_values() -> dict[str, Any]:
    """The core ``Config`` fields given in settings or the environment, typed but not
    yet validated together (``Config.__post_init__`` does that), with the Redis URL
    resolved from ``REDIS_CACHE_ALIAS`` when that is set.

    Returns:
        Field name -> value, only for the fields that were given.

    Raises:
        SettingsError: unknown keys, badly typed values, or a Redis location that
            cannot be resolved (see :func:`cache_redis_url`): all of them at once.
    """
    values, _, problems = _config_values()
    if problems:
        raise SettingsError(problems)
    return values


def _config_values() -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """What :func:`config_values` returns, where each value came from, and every
    problem found on the way."""
    given, problems = _given()
    values, sources, bad = _read_typed(core_config.Config, given)
    django_values, django_sources, django_bad = _read_typed(DjangoSettings, given)
    problems += bad + django_bad
    alias = django_values.get("redis_cache_alias")
    if alias is not None:
        if "redis_url" in sources:
            problems.append(
                f"{sources['redis_url']} and {django_sources['redis_cache_alias']} are both "
                "set; relier needs one Redis location: keep REDIS_URL or REDIS_CACHE_ALIAS, "
                "not both"
            )
        else:
            try:
                values["redis_url"] = cache_redis_url(alias)
            except ImproperlyConfigured as exc:
                problems.append(str(exc))
    return values, sources, problems


@functools.cache
def get_config() -> core_config.Config:
    """Build the core config from settings.RELIER and RELIER_* environment variables.

    Raises:
        SettingsError: every problem :func:`config_values` finds, plus every problem
            ``Config`` finds in the values that could be read, each naming the setting
            it came from; an ``ImproperlyConfigured`` and a core ``ConfigError``.
    """
    values, sources, problems = _config_values()
    for unknown in unknown_environment():  # once per process: get_config is cached
        logger.warning("%s; it is ignored", unknown)
    try:
        cfg = core_config.Config(**values)
    except ConfigError as exc:
        own = [_named(field, sources) + text for field, text in exc.by_field] or [str(exc)]
        raise SettingsError([*problems, *own]) from exc
    if problems:
        raise SettingsError(problems)
    return cfg


def _named(field: str, sources: dict[str, str]) -> str:
    # A value that was not given is at fault only with another one (the heartbeat's
    # interval against its TTL): it is named as the setting left at its default.
    return sources.get(field) or f"{field.upper()} (unset, its default)"


def cache_redis_url(alias: str) -> str:
    """The Redis URL of ``settings.CACHES[alias]``: its (first) LOCATION, with the
    OPTIONS password put into the URL when the URL has none.

    Args:
        alias: a key of ``settings.CACHES`` whose backend is django-redis's or Django's
            ``RedisCache``.

    Raises:
        ImproperlyConfigured: no such alias, another backend, a sharded or Sentinel
            django-redis client, or a LOCATION that is not a Redis URL.
    """
    setting = "settings.RELIER['REDIS_CACHE_ALIAS']"
    caches = getattr(settings, "CACHES", {}) or {}
    if alias not in caches:
        raise ImproperlyConfigured(
            f"{setting} is {alias!r}, but settings.CACHES has no such alias (it has: "
            f"{', '.join(sorted(caches)) or 'none'}); name one of those or set REDIS_URL"
        )
    cache = caches[alias]
    backend = cache.get("BACKEND", "")
    if backend not in _REDIS_CACHE_BACKENDS:
        raise ImproperlyConfigured(
            f"{setting} names the cache {alias!r}, whose BACKEND is {backend!r}; relier can "
            f"reuse only {' or '.join(_REDIS_CACHE_BACKENDS)}: set REDIS_URL instead"
        )
    options = cache.get("OPTIONS") or {}
    client_class = options.get("CLIENT_CLASS")
    if client_class is not None and client_class not in _PLAIN_DJANGO_REDIS_CLIENTS:
        raise ImproperlyConfigured(
            f"{setting} names the cache {alias!r}, whose CLIENT_CLASS {client_class!r} does "
            "not talk to the one server in LOCATION; set REDIS_URL to relier's server instead"
        )
    url = _first_location(cache.get("LOCATION"))
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(
            f"{setting} names the cache {alias!r}, whose LOCATION {url!r} is not a "
            "redis://, rediss:// or unix:// URL; set REDIS_URL instead"
        )
    # django-redis spells it PASSWORD; Django's RedisCache passes OPTIONS to redis-py.
    password = options.get("PASSWORD") or options.get("password")
    return _with_password(url, password) if password else url


def _first_location(location: Any) -> str:
    # Both backends accept several servers and write to the first one: that is where
    # relier's state must live.
    if isinstance(location, list | tuple):
        location = location[0] if location else ""
    elif isinstance(location, str):
        location = location.replace(";", ",").split(",")[0]
    return str(location or "").strip()


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    if parts.password is not None:
        return url  # redis-py lets the URL win over a password option; so do we
    host = parts.netloc.rpartition("@")[2]
    user = quote(parts.username or "", safe="")
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(str(password), safe='')}@{host}"))


def clear_cache() -> None:
    """Forget the cached settings (after changing ``RELIER_*`` environment variables;
    changes to ``settings.RELIER`` and ``settings.CACHES`` clear it by themselves)."""
    get_config.cache_clear()
    get_django_settings.cache_clear()


def _on_setting_changed(*, setting: str, **_: object) -> None:
    if setting in ("RELIER", "CACHES"):
        clear_cache()


def install() -> None:
    """Called from AppConfig.ready(): make the core read Django's settings."""
    core_config.set_provider(get_config)
    setting_changed.connect(_on_setting_changed, dispatch_uid="relier_django.conf")


def redis_location() -> str:
    """Where relier's Redis is (the URL, or the Sentinel master and its sentinels), with
    any password hidden: for error messages, the admin's "Redis cannot be reached" page
    and the commands' errors."""
    from .core.store.connection import describe

    return describe(get_config())
