"""The testproject's URLs without relier_django's, for ``memory_settings`` without
relier: Celery's Django fixup runs the system checks in the worker, which import the
URLconf."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
