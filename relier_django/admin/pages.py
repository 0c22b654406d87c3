"""What every Relier admin page shares: its URLs, its context, the permission it needs,
and one answer when relier's Redis cannot be reached: a 503 page in the admin's look
that says where Redis was looked for and what to check, never a traceback.

A page's context is computed before it renders, so a template never reads Redis
itself: a Redis error can only come from the view, where :func:`guarded` catches it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from .. import conf

logger = logging.getLogger("relier_django.admin")

TEMPLATES = "relier_django/admin/"
"""The one template root of the Relier pages (Django's ``admin/relier_django/`` holds
only the app index it looks for there)."""

View = Callable[..., HttpResponse]


def url(model_admin: ModelAdmin, page: str, *args: str) -> str:
    """The URL of one of the Relier pages (``changelist``, ``detail``, ``overview``,
    ``task``, ``scheduled``, ``periodic``, ``actions``, ``limits``, ``limit``) in
    ``model_admin``'s site."""
    name = f"admin:{model_admin.opts.app_label}_{model_admin.opts.model_name}_{page}"
    found: str = reverse(name, args=args, current_app=model_admin.admin_site.name)
    return found


def context(
    request: HttpRequest, model_admin: ModelAdmin, title: str, **extra: Any
) -> dict[str, Any]:
    """What every Relier page's template gets: the admin's own context, the page's
    title, whether the user may release and delete, and the links between the pages."""
    request.current_app = model_admin.admin_site.name  # {% url 'admin:...' %} follows it
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "can_manage": model_admin.has_manage_permission(request),
        "changelist_url": url(model_admin, "changelist"),
        "scheduled_url": url(model_admin, "scheduled"),
        "periodic_url": url(model_admin, "periodic"),
        **extra,
    }


def render(request: HttpRequest, name: str, values: dict[str, Any], status: int = 200) -> Any:
    return TemplateResponse(request, TEMPLATES + name, values, status=status)


def guarded(lost: str) -> Callable[[View], View]:
    """Turn a Redis error of the view into the "Redis cannot be reached" page (503).
    ``lost``: what the page cannot do meanwhile, as the page says it ("the dead-letter
    queue cannot be shown or changed")."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def page(request: HttpRequest, model_admin: ModelAdmin, **kwargs: Any) -> Any:
            try:
                return view(request, model_admin, **kwargs)
            except RedisError as exc:
                location = conf.redis_location()
                logger.error(
                    "Relier admin page %s: Redis at %s cannot be reached: %r",
                    request.path, location, exc, exc_info=True,
                )  # fmt: skip
                values = context(
                    request, model_admin, "Redis cannot be reached", redis_location=location,
                    lost=lost, error=f"{type(exc).__name__}: {exc}",
                    retry_url=request.get_full_path() if request.method == "GET" else None,
                )  # fmt: skip
                return render(request, "redis_down.html", values, status=503)

        return page

    return decorate


def read_only(lost: str) -> Callable[[View], View]:
    """A read-only page: the DLQ's view permission, GET only, never cached, and
    :func:`guarded`."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def allowed(request: HttpRequest, model_admin: ModelAdmin, **kwargs: Any) -> Any:
            if not model_admin.has_view_permission(request):
                raise PermissionDenied
            return view(request, model_admin, **kwargs)

        wrapped: View = never_cache(require_GET(guarded(lost)(allowed)))
        return wrapped

    return decorate
