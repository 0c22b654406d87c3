"""The testproject's settings for ``bench/worker_memory.py``'s workers.

The same Django project (its apps, middleware, templates, database, logging and
Celery settings), with the test suite's task modules (``testproject.demo``: dozens of
tasks, a few hundred lines each) replaced by the benchmark's one task, so what is
compared is relier_django against Celery, not the tests' fixtures. With
``BENCH_MEMORY_RELIER=0`` relier_django is not installed at all, as a Django user on
Celery alone has it: its app, its URLs, its hooks and its task modules are never imported.
"""

import os

from django.conf import global_settings

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS as _PROJECT_APPS

WITH_RELIER = os.environ.get("BENCH_MEMORY_RELIER", "1") == "1"

INSTALLED_APPS = [
    app
    for app in _PROJECT_APPS
    if app != "testproject.demo" and (WITH_RELIER or app != "relier_django")
]
CELERY_IMPORTS = ["bench.memory_tasks" if WITH_RELIER else "bench.memory_plain_tasks"]
if not WITH_RELIER:
    TASKS = getattr(global_settings, "TASKS", {})  # Django's own default, not relier's
    ROOT_URLCONF = "bench.memory_urls"  # the admin's, not relier's metrics endpoint
