"""``@rate_limit``: a sliding-window limit on a Django view, sync or async.

A sync view counts its hit on the process's sync Redis client, an async view on the
running loop's asyncio client; both run the one script ``ratelimit.lua``. Over the
limit the view is not called and the response is a 429 with ``Retry-After``. What it
promises, and how keys, proxies and Redis outages behave: ``docs/ratelimit.md``.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from . import conf
from .core.extras.ratelimit import Decision, Rate, check_scope, hit
from .core.model.config import Config
from .core.store.connection import async_client, sync_client
from .core.store.keys import KeySpace

__all__ = ["ANONYMOUS", "KEYS", "Rate", "client_ip", "rate_limit", "request_ip"]

logger = logging.getLogger(__name__)

V = TypeVar("V", bound=Callable[..., Any])
KeyFunc = Callable[[HttpRequest], "str | Awaitable[str]"]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

KEYS = ("ip", "user", "user_or_ip")
# The one bucket every anonymous request shares under key="user".
ANONYMOUS = "user:anonymous"


def rate_limit(
    rate: str | Rate, *, key: str | KeyFunc = "user_or_ip", scope: str | None = None
) -> Callable[[V], V]:
    """Limit a view to ``rate`` hits per client, on a sliding window.

    Args:
        rate: ``"5/m"``, ``"100/10s"``... (see :meth:`Rate.parse`) or a :class:`Rate`.
        key: whose hits are counted together: ``"ip"`` (the client address, see
            :func:`client_ip`), ``"user"`` (the authenticated user's pk; every anonymous
            request shares one bucket), ``"user_or_ip"`` (the user's pk, the address for
            anonymous requests), or a function ``(request) -> str`` (``async def`` is
            allowed on async views).
        scope: the limiter's name; requests share a limit only within one scope.
            Defaults to the view's dotted name (``module.qualname``); for a class-based
            view, its class's (``module.Class``, or ``module.Class.method`` under
            ``method_decorator``), so two view classes never share a limiter.

    Returns:
        The decorator. The wrapped view answers 429 with ``Retry-After`` (whole seconds,
        rounded up) when the limit is reached, without running the view.

    Raises:
        ValueError: a bad rate, key name or scope (at decoration time).
    """
    parsed = rate if isinstance(rate, Rate) else Rate.parse(rate)
    if not callable(key) and key not in KEYS:
        raise ValueError(f"key must be one of {', '.join(KEYS)} or a callable, got {key!r}")
    if scope is not None:
        check_scope(scope)

    def decorate(view: V) -> V:
        name = check_scope(scope or _default_scope(view))
        if iscoroutinefunction(view):
            return _async_wrapper(view, parsed, key, name)  # type: ignore[return-value]
        return _sync_wrapper(view, parsed, key, name)  # type: ignore[return-value]

    return decorate


def _default_scope(view: Callable[..., Any]) -> str:
    # Class-based views: every as_view() function is View.as_view.<locals>.view, and
    # method_decorator(name="dispatch") hands over partial(View.dispatch bound to the
    # instance). Their own names would put every view class in one limiter; the class
    # the request is for names it instead.
    view_class = getattr(view, "view_class", None)
    if view_class is not None:
        return f"{view_class.__module__}.{view_class.__qualname__}"
    method = getattr(view, "func", None)
    owner = getattr(method, "__self__", None)
    if method is not None and owner is not None and not isinstance(owner, type):
        cls = type(owner)
        return f"{cls.__module__}.{cls.__qualname__}.{method.__name__}"
    module, name = getattr(view, "__module__", None), getattr(view, "__qualname__", None)
    if not module or not name:  # a bare functools.partial, a callable object
        raise ValueError(f"cannot name a limiter after {view!r}: pass scope=")
    return f"{module}.{name}"


def _sync_wrapper(view: V, rate: Rate, key: str | KeyFunc, scope: str) -> Callable[..., Any]:
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        config = conf.get_config()
        call = hit(KeySpace.of(config), scope, _bucket(request, key, config), rate)
        try:
            refusal = _refusal(call.run(sync_client(config, fail_fast=True)))
        except redis.RedisError as exc:
            refusal = _unavailable(config, scope, exc)
        return view(request, *args, **kwargs) if refusal is None else refusal

    return wrapper


def _async_wrapper(view: V, rate: Rate, key: str | KeyFunc, scope: str) -> Callable[..., Any]:
    @functools.wraps(view)
    async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        config = conf.get_config()
        bucket = await _abucket(request, key, config)
        call = hit(KeySpace.of(config), scope, bucket, rate)
        try:
            refusal = _refusal(await call.arun(async_client(config, fail_fast=True)))
        except redis.RedisError as exc:
            refusal = _unavailable(config, scope, exc)
        return await view(request, *args, **kwargs) if refusal is None else refusal

    # Django calls a view marked as a coroutine function in the event loop, with await.
    return markcoroutinefunction(wrapper)


def _refusal(decision: Decision) -> HttpResponse | None:
    if decision.allowed:
        return None
    seconds = max(1, math.ceil(decision.retry_after_s))  # Retry-After is whole seconds
    response = HttpResponse(
        f"Too many requests: retry in {seconds} s.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(seconds)
    return response


def _unavailable(config: Config, scope: str, exc: redis.RedisError) -> HttpResponse | None:
    # An operator must act (Redis is unreachable or refusing): ERROR, once per request.
    admitted = config.ratelimit_fail_open
    logger.error(
        "rate limiter unavailable, request %s: scope=%s reason=%s",
        "admitted (RATELIMIT_FAIL_OPEN)" if admitted else "refused with 503",
        scope,
        f"{type(exc).__name__}: {exc}",
    )
    if admitted:
        return None
    return HttpResponse(
        "Service unavailable: the rate limiter cannot reach its store.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )


# -- whose hit is it ------------------------------------------------------------------
def _bucket(request: HttpRequest, key: str | KeyFunc, config: Config) -> str:
    if callable(key):
        return _checked(key, key(request))
    if key == "ip":
        return f"ip:{request_ip(request, config)}"
    return _user_bucket(_user(request, key), key, request, config)


async def _abucket(request: HttpRequest, key: str | KeyFunc, config: Config) -> str:
    if callable(key):
        value = key(request)
        return _checked(key, await value if inspect.isawaitable(value) else value)
    if key == "ip":
        return f"ip:{request_ip(request, config)}"
    auser = getattr(request, "auser", None)
    if auser is None:
        raise _no_auth_middleware(key)
    # request.user would query the session in the event loop; auser() is its async twin.
    return _user_bucket(await auser(), key, request, config)


def _user(request: HttpRequest, key: str) -> Any:
    user = getattr(request, "user", None)
    if user is None:
        raise _no_auth_middleware(key)
    return user


def _user_bucket(user: Any, key: str, request: HttpRequest, config: Config) -> str:
    if user.is_authenticated:
        return f"user:{user.pk}"
    return ANONYMOUS if key == "user" else f"ip:{request_ip(request, config)}"


def _no_auth_middleware(key: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"@rate_limit(key={key!r}) needs request.user: add "
        "django.contrib.auth.middleware.AuthenticationMiddleware to MIDDLEWARE, "
        "or use key='ip'"
    )


def _checked(key: Any, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"rate-limit key function {key!r} must return a non-empty str: {value!r}")
    return value


# -- the client's address -------------------------------------------------------------
def request_ip(request: HttpRequest, config: Config) -> str:
    """The client address of ``request``, believing only ``config.trusted_proxies``."""
    return client_ip(
        request.META.get("REMOTE_ADDR", ""),
        request.META.get("HTTP_X_FORWARDED_FOR"),
        config.trusted_proxies,
    )


def client_ip(remote_addr: str, forwarded_for: str | None, trusted_proxies: Sequence[str]) -> str:
    """The address of the client, as far as the trusted proxies can vouch for it.

    ``REMOTE_ADDR`` is the peer of the socket: the client, or a proxy. Only when it is a
    trusted proxy is ``X-Forwarded-For`` read, and from the right: each proxy appends
    the address it received the request from, so the right-hand entries were written by
    your proxies, while anything left of them is whatever the client chose to send. The
    first entry from the right that is not a trusted proxy is the client.

    Args:
        remote_addr: ``REMOTE_ADDR``.
        forwarded_for: the ``X-Forwarded-For`` value (comma-separated), or None.
        trusted_proxies: IPs or CIDR networks of your reverse proxies.

    Returns:
        The client address (normalized; an IPv4-mapped IPv6 address as IPv4), an entry
        that is not an IP address as given, the farthest hop when every hop is a
        trusted proxy, or ``"unknown"`` when ``remote_addr`` is empty.
    """
    networks = _networks(tuple(trusted_proxies))
    address = _normalized(remote_addr)
    if not _is_trusted(address, networks):
        return address or "unknown"
    hops = [hop.strip() for hop in (forwarded_for or "").split(",")]
    for hop in reversed([h for h in hops if h]):
        address = _normalized(hop)
        if not _is_trusted(address, networks):
            return address
    return address


@functools.lru_cache(maxsize=16)
def _networks(proxies: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def _normalized(text: str) -> str:
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return text.strip()
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:a.b.c.d from a dual-stack socket
    return str(mapped or ip)


def _is_trusted(address: str, networks: tuple[IPNetwork, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)
