"""Example tasks used by the tests, the chaos runner and the demo."""

from __future__ import annotations

import time

import redis
from celery import shared_task
from django.conf import settings


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.RELIER_REDIS_URL)


@shared_task(name="demo.plain_record")
def plain_record(label: str, sleep_s: float = 0.0) -> str:
    """A vanilla Celery task: records each execution, so a test can count runs."""
    if sleep_s:
        time.sleep(sleep_s)
    _redis().incr(f"demo:plain:{label}")
    return label
