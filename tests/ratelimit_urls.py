"""Test-only URLs for tests/integration/django_app/test_ratelimit.py: limited sync and async views.

``CALLS`` counts how often each view body ran, so a test can prove a refused request
never reached its view.
"""

from __future__ import annotations

from collections import Counter

from django.http import HttpRequest, HttpResponse
from django.urls import path

from relier_django.ratelimit import rate_limit

CALLS: Counter[str] = Counter()


@rate_limit("2/m", key="ip")
def sync_view(request: HttpRequest) -> HttpResponse:
    CALLS["sync"] += 1
    return HttpResponse("sync ok")


@rate_limit("2/m", key="ip")
async def async_view(request: HttpRequest) -> HttpResponse:
    CALLS["async"] += 1
    return HttpResponse("async ok")


@rate_limit("1/m", key="ip", scope="tests.by_ip")
def by_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@rate_limit("1/m", key="user_or_ip", scope="tests.by_user")
def by_user(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@rate_limit("50/m", key="ip", scope="tests.live")
def live(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("sync/", sync_view),
    path("async/", async_view),
    path("by-ip/", by_ip),
    path("by-user/", by_user),
    path("live/", live),
]
