"""The only module that reads Django settings or the environment.

``settings.RELIER`` (a dict, keys in upper case) and ``RELIER_*`` environment
variables, read through django-environ, become one frozen core ``Config``. An
environment variable wins over the settings dict, so one image can be reconfigured
per deployment. The result is cached and dropped on ``setting_changed``.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

import environ
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .core import config as core_config
from .core.errors import ConfigError

_env = environ.Env()


def _cast(field: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    hint = typing.get_type_hints(core_config.Config)[field.name]
    if typing.get_origin(hint) is tuple:
        return _cast_strings(raw, source)
    base = {int: int, float: float, str: str, bool: bool}
    target = next((t for t in base if hint is t or t in typing.get_args(hint)), str)
    if raw is None or (isinstance(raw, str) and raw == "" and type(None) in typing.get_args(hint)):
        return None
    try:
        if target is bool and isinstance(raw, str):
            return _env.smart_cast(raw, bool)
        return target(raw)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{source} must be a {target.__name__}, got {raw!r}") from exc


def _cast_strings(raw: Any, source: str) -> tuple[str, ...]:
    # A list in the settings dict; comma-separated in the environment ("a, b"); a dict
    # in the settings dict becomes "key=value" entries ({"shop.charge": "100/s"}).
    if isinstance(raw, dict):
        raw = [f"{k}={v}" for k, v in raw.items()]
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ImproperlyConfigured(f"{source} must be a list of strings, got {raw!r}")
    return tuple(item.strip() for item in items if item.strip())


@functools.cache
def get_config() -> core_config.Config:
    """Build the core config from settings.RELIER and RELIER_* environment variables."""
    given = getattr(settings, "RELIER", {}) or {}
    known = {name.upper(): name for name in core_config.FIELDS}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.RELIER has unknown key(s) {', '.join(unknown)}; "
            f"known keys are {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(core_config.Config)}
    for upper, name in known.items():
        env_name = f"RELIER_{upper}"
        if env_name in _env.ENVIRON:
            values[name] = _cast(fields[name], _env.str(env_name), env_name)
        elif upper in given:
            values[name] = _cast(fields[name], given[upper], f"settings.RELIER[{upper!r}]")
    try:
        return core_config.Config(**values)
    except ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from exc


def _on_setting_changed(*, setting: str, **_: object) -> None:
    if setting == "RELIER":
        get_config.cache_clear()


def install() -> None:
    """Called from AppConfig.ready(): make the core read Django's settings."""
    core_config.set_provider(get_config)
    setting_changed.connect(_on_setting_changed, dispatch_uid="relier_django.conf")
