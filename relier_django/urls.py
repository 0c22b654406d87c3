"""relier_django's own URLs: mount them with ``path("relier/", include("relier_django.urls"))``."""

from __future__ import annotations

from django.urls import path

from .metrics.views import metrics_view

app_name = "relier"
urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
