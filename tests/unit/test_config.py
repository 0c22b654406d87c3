"""The config object refuses values that cannot work, and settings reach it from Django."""

from __future__ import annotations

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
