"""The dead-letter queue in the Django admin, without a table (docs/dlq-admin.md).

django-rq's pattern: the unmanaged ``DeadLetter`` model puts a "Relier" section on the
admin index, and ``get_urls()`` replaces every ModelAdmin page with the DLQ pages of
``admin_views``, each wrapped in ``admin_site.admin_view`` (staff login, CSRF, no cache).
Every page needs ``relier_django.view_dlq``; release and delete also need
``relier_django.manage_dlq``. Superusers have both. Staff without one get a 403 page in
the admin's look that names the permission and whom to ask, not Django's bare
"403 Forbidden": each route declares what it needs, so the views keep raising a plain
``PermissionDenied``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, re_path

from ..models import MANAGE_PERMISSION, VIEW_PERMISSION, DeadLetter
from . import dlq as admin_views
from . import limits as admin_limits
from . import overview as admin_overview
from . import schedule as admin_schedule
from . import task as admin_task


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION))

    def has_manage_permission(self, request: HttpRequest) -> bool:
        """May release and delete entries (on top of the view permission)."""
        return self.has_view_permission(request) and request.user.has_perm(MANAGE_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        # The "Relier" section shows exactly when its one page would open.
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def forbidden(self, request: HttpRequest, missing: Sequence[str]) -> TemplateResponse:
        """The 403 page: the permissions ``missing`` for what was asked, each by its name
        in code and as the Users and Groups pages list it, and whom to ask for them."""
        request.current_app = self.admin_site.name
        names = dict(self.opts.permissions)  # codename -> "Can view the dead-letter queue"
        # As ``str(Permission)`` reads, without a query: "Relier | dead-letter queue | …".
        listed = f"{self.opts.app_config.verbose_name} | {self.opts.verbose_name}"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Permission needed",
            "missing": [(p, f"{listed} | {names[p.partition('.')[2]]}") for p in missing],
            "manage": MANAGE_PERMISSION in missing,
        }
        return TemplateResponse(request, "relier_django/admin/forbidden.html", context, status=403)

    def get_urls(self) -> list[URLPattern]:
        def wrap(
            view: Callable[..., HttpResponse], needs: Sequence[str] = (VIEW_PERMISSION,)
        ) -> Callable[..., HttpResponse]:
            def bound(request: HttpRequest, **kwargs: Any) -> HttpResponse:
                try:
                    return view(request, model_admin=self, **kwargs)
                except PermissionDenied:
                    missing = [p for p in needs if not request.user.has_perm(p)]
                    if not missing:  # refused for another reason: Django's own 403
                        raise
                    return self.forbidden(request, missing)

            wrapped: Callable[..., HttpResponse] = self.admin_site.admin_view(bound)
            return wrapped

        info = f"{self.opts.app_label}_{self.opts.model_name}"
        # An id is matched whole, any character included: a task id (and so an entry
        # id) may contain a slash, and one stored before push checked ids (model.ids)
        # may even hold a newline, which <path:>'s "." refuses; its page, and every
        # page linking to it, must still open (reverse() would raise: an HTTP 500).
        any_id = r"(?P<{}>[\s\S]+)/\Z"
        return [
            path("", wrap(admin_views.changelist), name=f"{info}_changelist"),
            path(
                "actions/",
                wrap(admin_views.act, needs=(VIEW_PERMISSION, MANAGE_PERMISSION)),
                name=f"{info}_actions",
            ),
            # Read-only schedule pages (docs/scheduling.md): the view permission suffices.
            path("scheduled/", wrap(admin_schedule.scheduled_list), name=f"{info}_scheduled"),
            path("periodic/", wrap(admin_schedule.periodic_list), name=f"{info}_periodic"),
            # Flow control (docs/flow-control.md): read-only, view permission.
            path("limits/", wrap(admin_limits.limit_list), name=f"{info}_limits"),
            path("limits/scope/", wrap(admin_limits.limit_scope), name=f"{info}_limit"),
            # The cluster at a glance (docs/admin-overview.md): read-only, view permission.
            path("overview/", wrap(admin_overview.overview), name=f"{info}_overview"),
            re_path(
                "^overview/task/" + any_id.format("task_id"),
                wrap(admin_task.task),
                name=f"{info}_task",
            ),
            re_path(
                "^entry/" + any_id.format("entry_id"),
                wrap(admin_views.detail),
                name=f"{info}_detail",
            ),
        ]
