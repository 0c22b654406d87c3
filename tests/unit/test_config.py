"""The config object refuses values that cannot work, and settings reach it from Django."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from relier_django import conf
from relier_django.core.model.config import Config
from relier_django.core.model.errors import ConfigError


def test_refresh_interval_must_be_below_ttl():
    with pytest.raises(ConfigError, match="heartbeat_interval_s"):
        Config(heartbeat_ttl_s=3, heartbeat_interval_s=3)


def test_default_refresh_is_a_third_of_the_ttl():
    assert Config(heartbeat_ttl_s=9).heartbeat_every_s == 3


def test_the_leader_lease_is_three_scan_intervals_unless_set():
    assert Config(scan_interval_s=2).leader_lease_ttl_s == 6
    assert Config(scan_interval_s=2, leader_lease_s=20).leader_lease_ttl_s == 20
    with pytest.raises(ConfigError, match="leader_lease_s"):
        Config(leader_lease_s=0)


def test_settings_dict_and_environment_reach_the_config(settings, monkeypatch):
    monkeypatch.delenv("RELIER_REDIS_URL", raising=False)
    settings.RELIER = {"REDIS_URL": "redis://example:1/0", "MAX_RETRIES": 7}
    assert conf.get_config().max_retries == 7
    monkeypatch.setenv("RELIER_MAX_RETRIES", "9")
    conf.get_config.cache_clear()
    assert conf.get_config().max_retries == 9
    assert conf.get_config().redis_url == "redis://example:1/0"


def test_unknown_setting_names_the_known_ones(settings):
    settings.RELIER = {"HEARTBEAT_TLL_S": 3}
    with pytest.raises(ImproperlyConfigured, match="HEARTBEAT_TTL_S"):
        conf.get_config()


def test_badly_typed_environment_value_is_a_clear_error(settings, monkeypatch):
    settings.RELIER = {}
    monkeypatch.setenv("RELIER_MAX_RETRIES", "lots")
    conf.get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match="RELIER_MAX_RETRIES must be an int"):
        conf.get_config()


@pytest.mark.parametrize(
    ("key", "value"),
    [("MAX_RETRIES", 2.9), ("MAX_RETRIES", True), ("KEY_PREFIX", ["a"]),
     ("EMBEDDED_RESURRECTOR", [0])],
)  # fmt: skip
def test_a_settings_dict_value_of_the_wrong_type_is_refused_not_coerced(
    settings, monkeypatch, key, value
):
    monkeypatch.delenv(f"RELIER_{key}", raising=False)
    settings.RELIER = {key: value}
    with pytest.raises(ImproperlyConfigured, match=rf"settings.RELIER\['{key}'\] must be a"):
        conf.get_config()


def test_an_int_where_a_float_is_expected_and_a_numeric_string_are_accepted(settings):
    settings.RELIER = {"HEARTBEAT_TTL_S": 9}
    assert conf.get_config().heartbeat_ttl_s == 9.0
    settings.RELIER = {"HEARTBEAT_TTL_S": "10"}  # strings are parsed, as from the env
    assert conf.get_config().heartbeat_ttl_s == 10.0


def test_every_setting_is_documented_with_its_default():
    """docs/settings.md has one row per core Config field and per Django-level key."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| ([^|]*) \|", text, re.MULTILINE))
    settings_keys = set(conf.CONFIG_KEYS) | set(conf.DJANGO_KEYS)
    assert sorted(settings_keys - rows.keys()) == [], "missing from docs/settings.md"
    assert sorted(rows.keys() - settings_keys) == [], "documented but not a setting"
    assert [key for key, default in rows.items() if not default.strip()] == []


def test_django_level_keys_are_accepted_and_typed(settings, monkeypatch):
    monkeypatch.delenv("RELIER_REDIS_URL", raising=False)
    settings.RELIER = {"ALLOW_UNSAFE_REDIS": True, "WORKER_QUEUES": ["a", "b"]}
    assert conf.get_django_settings() == conf.DjangoSettings(
        allow_unsafe_redis=True, worker_queues=("a", "b")
    )
    conf.get_config()  # the unknown-key check accepts them
    monkeypatch.setenv("RELIER_WORKER_QUEUES", "c, d")
    conf.clear_cache()
    assert conf.get_django_settings().worker_queues == ("c", "d")


def test_every_bad_key_and_value_is_reported_at_once_on_one_line(settings, monkeypatch):
    monkeypatch.delenv("RELIER_MAX_RETRIES", raising=False)
    monkeypatch.setenv("RELIER_EMBEDDED_RESURRECTOR", "maybe")
    settings.RELIER = {"HEARTBEAT_TTL": 3, "MAX_RETRIES": 2.9, "RESURRECT_BATCH": 0}
    conf.clear_cache()
    with pytest.raises(conf.SettingsError) as raised:
        conf.get_config()
    problems = raised.value.problems
    assert len(problems) == 4, problems
    assert "'HEARTBEAT_TTL' (did you mean 'HEARTBEAT_TTL_S'?)" in problems[0]
    assert "settings.RELIER['MAX_RETRIES'] must be an int, got 2.9" in problems
    assert any("RELIER_EMBEDDED_RESURRECTOR must be a bool" in p for p in problems)
    assert problems[-1] == "settings.RELIER['RESURRECT_BATCH'] must be >= 1"  # Config's own, last
    assert str(raised.value) == "; ".join(problems) and "\n" not in str(raised.value)
    # Django sees ImproperlyConfigured; a worker (core code) sees a ConfigError.
    assert isinstance(raised.value, ImproperlyConfigured)
    assert isinstance(raised.value, ConfigError)
    with pytest.raises(conf.SettingsError, match="unknown key 'HEARTBEAT_TTL'"):
        conf.get_django_settings()  # the Django-level keys are read the same way


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("HEARTBEAT_TTL", "did you mean 'HEARTBEAT_TTL_S'?"),
        ("max_retries", "did you mean 'MAX_RETRIES'?"),  # keys are upper case
        ("REDIS_CACHE", "did you mean 'REDIS_CACHE_ALIAS'?"),
        ("NOTHING_LIKE_IT", "known keys: ADMISSION_LIMIT, "),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_known_one(settings, key, says):
    settings.RELIER = {key: 1}
    with pytest.raises(ImproperlyConfigured) as raised:
        conf.get_config()
    assert f"settings.RELIER has an unknown key {key!r} ({says}" in str(raised.value)


def test_a_worker_refuses_to_start_with_one_line_naming_every_bad_setting(monkeypatch):
    # G6: the core cannot name Django's ImproperlyConfigured; whatever the provider
    # raises becomes SystemExit (Celery swallows an Exception from worker_init).
    from relier_django.core.model import config
    from relier_django.core.worker import hooks

    def provider() -> Config:
        raise conf.SettingsError(["RELIER_A must be an int, got 'x'", "unknown key 'B'"])

    monkeypatch.setattr(config, "_provider", provider)
    with pytest.raises(SystemExit) as raised:
        hooks._on_worker_init()
    line = str(raised.value.code)
    assert "RELIER_A must be an int, got 'x'; unknown key 'B'" in line
    assert "refuses to start" in line and "\n" not in line
