"""The config object refuses values that cannot work, and settings reach it from Django."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from relier_django import conf
from relier_django.core.config import Config
from relier_django.core.errors import ConfigError


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
    with pytest.raises(ImproperlyConfigured, match="RELIER_MAX_RETRIES must be a int"):
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
