"""The metrics endpoint: ``path("relier/", include("relier_django.urls"))`` serves
Prometheus text at ``relier/metrics``.

Who may read it: a request with ``Authorization: Bearer <RELIER["METRICS_TOKEN"]>``,
or a logged-in staff user. Anyone else gets 403, and so does everyone but staff when
no token is set. A Redis that cannot be reached answers 503 (Prometheus marks the
target down), never a traceback.
"""

from __future__ import annotations

import hmac
import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from .. import conf, metrics

logger = logging.getLogger("relier_django.metrics")


def _allowed(request: HttpRequest) -> bool:
    token = conf.get_django_settings().metrics_token
    given = request.headers.get("Authorization", "")
    if token and given.startswith("Bearer "):
        return hmac.compare_digest(given.removeprefix("Bearer ").encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The whole cluster's figures in the Prometheus text format."""
    if not _allowed(request):
        return HttpResponse(
            "relier metrics: send Authorization: Bearer <RELIER['METRICS_TOKEN']>, or log in "
            "as staff\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    try:
        body = metrics.exposition(metrics.read(), metrics.outbox_backlog())
    except RedisError as exc:
        logger.error("metrics: relier's Redis cannot be read: %s", exc, exc_info=True)
        return HttpResponse(
            f"relier metrics: relier's Redis cannot be read ({type(exc).__name__})\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(body, content_type=metrics.CONTENT_TYPE)
