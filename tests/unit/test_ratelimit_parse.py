"""Rate limiter pieces that need no server (docs/ratelimit.md): rates parse or fail
clearly, the client address is read as the trusted proxies vouch for it (R5), and the
settings reach the config."""

from __future__ import annotations

import functools

import pytest
from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse

from relier_django import conf
from relier_django.core.extras.ratelimit import Rate
from relier_django.core.model.config import Config
from relier_django.core.model.errors import ConfigError
from relier_django.ratelimit import client_ip, rate_limit


# -- Rate.parse ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "limit", "window_s"),
    [
        ("5/s", 5, 1),
        ("5/m", 5, 60),
        ("3/h", 3, 3600),
        ("1/d", 1, 86400),
        ("100/10s", 100, 10),
        ("20/15m", 20, 900),
        (" 7 / 2 h ", 7, 7200),
    ],
)
def test_a_rate_is_a_count_per_optional_multiple_of_a_unit(text, limit, window_s):
    rate = Rate.parse(text)
    assert (rate.limit, rate.window_s, rate.window_ms) == (limit, window_s, window_s * 1000)


@pytest.mark.parametrize(
    "text", ["", "5", "5/", "/m", "five/m", "5/min", "5/ms", "5/x", "-1/m", "5/-2s", "5/m/m"]
)
def test_anything_else_is_a_value_error_showing_the_form(text):
    with pytest.raises(ValueError, match=r'looks like "5/m" or "100/10s"'):
        Rate.parse(text)


@pytest.mark.parametrize("text", ["0/m", "5/0s", "0/0m"])
def test_a_zero_count_or_multiplier_is_refused(text):
    with pytest.raises(ValueError, match=">= 1"):
        Rate.parse(text)


def test_a_rate_too_large_for_exact_arithmetic_in_lua_is_refused():
    assert Rate(10**6, 86400).limit == 10**6
    with pytest.raises(ValueError, match="too large"):
        Rate(2**40, 86400)


def test_a_non_string_rate_is_a_value_error():
    with pytest.raises(ValueError, match="got 5"):
        Rate.parse(5)  # type: ignore[arg-type]


# -- client_ip -------------------------------------------------------------------------
PROXIES = ("10.0.0.0/8", "192.0.2.1", "2001:db8::/32")


@pytest.mark.parametrize(
    ("remote", "forwarded", "expected"),
    [
        # No trusted peer: the header is the client's own words, ignored.
        ("198.51.100.7", "203.0.113.9", "198.51.100.7"),
        # Behind trusted proxies: the first untrusted entry from the right.
        ("10.1.2.3", "203.0.113.9", "203.0.113.9"),
        ("10.1.2.3", "6.6.6.6, 203.0.113.9, 192.0.2.1", "203.0.113.9"),
        ("10.1.2.3", "6.6.6.6,203.0.113.9,10.9.9.9", "203.0.113.9"),
        ("2001:db8::1", "2001:0db8:0:0:0:0:0:2, 2001:db8:0::3", "2001:db8::2"),
        # Every hop trusted: the farthest one known.
        ("10.1.2.3", "10.7.7.7, 192.0.2.1", "10.7.7.7"),
        # A trusted peer that sent no header (a health check from the proxy itself).
        ("10.1.2.3", None, "10.1.2.3"),
        ("10.1.2.3", " , ", "10.1.2.3"),
        # An entry that is not an address is not a trusted proxy: it is the client.
        ("10.1.2.3", "203.0.113.9, unknown", "unknown"),
        # A dual-stack socket's IPv4-mapped form is the IPv4 address.
        ("::ffff:198.51.100.7", None, "198.51.100.7"),
        ("::ffff:10.1.2.3", "203.0.113.9", "203.0.113.9"),
        ("", None, "unknown"),
    ],
)
def test_the_client_is_the_first_untrusted_address_from_the_right(remote, forwarded, expected):
    assert client_ip(remote, forwarded, PROXIES) == expected


def test_without_trusted_proxies_x_forwarded_for_is_never_read():
    assert client_ip("10.1.2.3", "203.0.113.9", ()) == "10.1.2.3"


# -- the decorator, built without a request -------------------------------------------
def test_the_decorator_refuses_bad_arguments_when_it_is_applied():
    with pytest.raises(ValueError, match="looks like"):
        rate_limit("5 per minute")
    with pytest.raises(ValueError, match="key must be one of ip, user, user_or_ip"):
        rate_limit("5/m", key="session")
    with pytest.raises(ValueError, match="without braces"):
        rate_limit("5/m", scope="a{b}")


def test_an_async_view_stays_a_coroutine_function_for_django():
    async def view(request) -> HttpResponse:
        return HttpResponse()

    def sync_view(request) -> HttpResponse:
        return HttpResponse()

    assert iscoroutinefunction(rate_limit("5/m")(view))
    assert not iscoroutinefunction(rate_limit("5/m")(sync_view))
    assert rate_limit("5/m")(view).__name__ == "view"


# -- settings --------------------------------------------------------------------------
def test_trusted_proxies_come_from_a_list_or_a_comma_separated_environment_variable(
    settings, monkeypatch
):
    monkeypatch.delenv("RELIER_TRUSTED_PROXIES", raising=False)
    settings.RELIER = {"TRUSTED_PROXIES": ["10.0.0.0/8", "192.0.2.1"], "RATELIMIT_FAIL_OPEN": False}
    config = conf.get_config()
    assert config.trusted_proxies == ("10.0.0.0/8", "192.0.2.1")
    assert config.ratelimit_fail_open is False
    monkeypatch.setenv("RELIER_TRUSTED_PROXIES", "172.16.0.0/12, 192.0.2.9")
    conf.get_config.cache_clear()
    assert conf.get_config().trusted_proxies == ("172.16.0.0/12", "192.0.2.9")
    monkeypatch.delenv("RELIER_TRUSTED_PROXIES")
    conf.get_config.cache_clear()
    assert Config().trusted_proxies == () and Config().ratelimit_fail_open is True


def test_a_bad_trusted_proxy_is_a_configuration_error_naming_it(settings):
    with pytest.raises(ConfigError, match=r"'10\.0\.0\.300'"):
        Config(trusted_proxies=("10.0.0.300",))
    with pytest.raises(ConfigError, match="tuple"):
        Config(trusted_proxies="10.0.0.1")  # type: ignore[arg-type]
    settings.RELIER = {"TRUSTED_PROXIES": ["proxy.internal"]}
    with pytest.raises(ImproperlyConfigured, match=r"proxy\.internal"):
        conf.get_config()
    settings.RELIER = {"TRUSTED_PROXIES": [10]}
    with pytest.raises(ImproperlyConfigured, match="list of strings"):
        conf.get_config()


def test_a_view_without_a_name_needs_an_explicit_scope():
    view = functools.partial(lambda request, extra: HttpResponse(), extra=1)
    with pytest.raises(ValueError, match="pass scope="):
        rate_limit("5/m")(view)
    assert rate_limit("5/m", scope="named")(view).__wrapped__ is view
