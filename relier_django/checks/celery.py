"""Celery's serializers: JSON, never pickle, for relier's messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import current_app
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register

from .common import PICKLE, TAG


@register(TAG)
def check_celery_serializers(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """relier.E005: Celery configured to send or accept pickle.

    Returns:
        One error per offending Celery setting.
    """
    celery_conf = current_app.conf
    errors: list[CheckMessage] = []
    risk = (
        "a worker that accepts pickle runs whatever code anyone who can write to the broker "
        "sends it; relier's envelopes are JSON and need nothing else."
    )
    for name in ("task_serializer", "result_serializer"):
        if celery_conf.get(name) in PICKLE:
            errors.append(
                Error(
                    f"Celery's {name} is {celery_conf.get(name)!r}: {risk}",
                    hint=f"Set {name} = 'json' (CELERY_{name.upper()} = 'json' in Django "
                    "settings, with the usual CELERY namespace).",
                    id="relier.E005",
                )
            )
    for name in ("accept_content", "result_accept_content"):
        accepted = list(celery_conf.get(name) or ())
        if any(kind in PICKLE for kind in accepted):
            kept = [kind for kind in accepted if kind not in PICKLE] or ["json"]
            errors.append(
                Error(
                    f"Celery's {name} {accepted!r} includes pickle: {risk}",
                    hint=f"Set {name} = {kept!r} (CELERY_{name.upper()} in Django settings, "
                    "with the usual CELERY namespace).",
                    id="relier.E005",
                )
            )
    return errors
