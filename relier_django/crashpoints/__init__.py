"""Crash-point testing for your own tasks, as a pytest plugin (docs/crash-testing.md).

In a ``conftest.py``: ``pytest_plugins = ["relier_django.crashpoints"]``; then in a
test::

    def test_checkout_survives_every_crash(crashpoints):
        crashpoints(checkout, order_id=7, effects={"charges": gateway.count})

The task runs against a private Redis and a real Celery worker of your project; it is
killed (SIGKILL) at each boundary its incarnation crosses (each checkpoint, each inbox
commit, each push, before and after ``commit.lua``), recovered by relier, and must
commit exactly once, with each effect happening exactly once (or as often as told).
"""

from .explore import Effect, EffectSpec
from .plugin import (
    CrashPoints,
    crashpoints,
    crashpoints_celery_app,
    crashpoints_env,
    crashpoints_redis,
)
from .report import Report, Run

__all__ = [
    "CrashPoints",
    "Effect",
    "EffectSpec",
    "Report",
    "Run",
    "crashpoints",
    "crashpoints_celery_app",
    "crashpoints_env",
    "crashpoints_redis",
]
