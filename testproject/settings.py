"""Settings for the testproject: the model for what a relier_django user writes.

Everything that differs between machines comes from the environment through
django-environ; the defaults run the demo on one machine with no set-up.
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
RUN_DIR = BASE_DIR / ".run"

env = environ.Env()
# A local .env file is optional; real deployments set the variables themselves.
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="testproject-not-a-secret")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "relier_django",
    "testproject.demo",
    # Its PeriodicTask rows, which relier fires with RELIER["CELERY_BEAT_MODELS"].
    "django_celery_beat",
]
if __import__("django").VERSION < (6, 0):  # django.tasks comes from its backport
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{RUN_DIR / 'db.sqlite3'}"),
}

# A second database, "pg": the on_commit tests run on it as well as on SQLite. The
# testproject never looks for a server: tests/conftest.py starts a private PostgreSQL
# and sets TESTPROJECT_POSTGRES_URL to it, which the workers it starts inherit. Empty
# (the default) means no "pg" alias.
if env.str("TESTPROJECT_POSTGRES_URL", default=""):
    DATABASES["pg"] = env.db("TESTPROJECT_POSTGRES_URL")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# --- Redis, Celery and relier_django ----------------------------------------------
# 6391 is the private Redis that `make demo` starts in ./.run; tests and chaos runs
# always pass their own URLs. Production sets RELIER_REDIS_URL.
RELIER_REDIS_URL = env.str("RELIER_REDIS_URL", default="redis://127.0.0.1:6391/0")

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=RELIER_REDIS_URL)
# kombu's Redis transport without its ack emulation for relier_django's own messages
# (docs/settings.md); the benchmarks' Celery contenders set "redis", kombu's own.


def broker_transport(url: str) -> str:
    """The transport for a broker URL: CELERY_BROKER_TRANSPORT, else relier_django's."""
    if "CELERY_BROKER_TRANSPORT" in os.environ:
        return os.environ["CELERY_BROKER_TRANSPORT"]
    if url.startswith("sentinel://"):
        return "relier_django.transport:SentinelTransport"
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return "pyamqp"  # RabbitMQ: kombu's own transport
    return "relier_django.transport:Transport"


CELERY_BROKER_TRANSPORT = broker_transport(CELERY_BROKER_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True
# Off by default, as in Celery; the delivery benchmark turns them on for its
# "acks_late" contender.
CELERY_TASK_ACKS_LATE = env.bool("CELERY_TASK_ACKS_LATE", default=False)
CELERY_TASK_REJECT_ON_WORKER_LOST = env.bool("CELERY_TASK_REJECT_ON_WORKER_LOST", default=False)
CELERY_WORKER_PREFETCH_MULTIPLIER = env.int("CELERY_WORKER_PREFETCH_MULTIPLIER", default=4)
# RabbitMQ's quorum queues, and a default queue of another name, for
# tests/integration/celery_compat/test_rabbitmq_broker.py.
CELERY_TASK_DEFAULT_QUEUE_TYPE = env.str("CELERY_TASK_DEFAULT_QUEUE_TYPE", default="classic")
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="celery")
# RabbitMQ's x-max-priority on the queues Celery declares, for the priority tests.
if env.str("CELERY_TASK_QUEUE_MAX_PRIORITY", default=""):
    CELERY_TASK_QUEUE_MAX_PRIORITY = env.int("CELERY_TASK_QUEUE_MAX_PRIORITY")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # How long kombu's Redis transport waits before redelivering an unacknowledged
    # message, and how often it looks (every interval x throttle seconds).
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    "unacked_restore_interval": env.float("CELERY_UNACKED_RESTORE_INTERVAL", default=10),
    "unacked_restore_throttle": env.int("CELERY_UNACKED_RESTORE_THROTTLE", default=10),
    # RabbitMQ (amqp://): push() returns once the broker confirmed the message (W008).
    "confirm_publish": True,
}
# Celery's broker through Redis Sentinel is kombu's business, not relier's: a broker URL
# of one sentinel:// per sentinel, CELERY_BROKER_URL="sentinel://10.0.0.5:26379/0;
# sentinel://10.0.0.6:26379/0" (a password in it is the master's), plus the master's
# name (and the sentinels' own password, if any) as transport options.
if env.str("CELERY_BROKER_MASTER_NAME", default=""):
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = env.str("CELERY_BROKER_MASTER_NAME")
    if env.str("CELERY_BROKER_SENTINEL_PASSWORD", default=""):
        CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = {
            "password": env.str("CELERY_BROKER_SENTINEL_PASSWORD")
        }
    # A publish must outlast a failover (down-after-milliseconds plus the election: a
    # few seconds), not Celery's default 0.6 s of retries.
    CELERY_TASK_PUBLISH_RETRY_POLICY = {
        "max_retries": 12, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0,
    }  # fmt: skip

RELIER = {
    "REDIS_URL": RELIER_REDIS_URL,
    # testproject/demo/limit_tasks.py's named limit (docs/flow-control.md).
    # "single": one at a time per key, for the per-call tests
    # (tests/integration/push/test_limits_per_call.py).
    "LIMITS": {"shared": {"concurrency": 2}, "single": {"concurrency": 1, "per_key": True}},
    # django-celery-beat's rows fired by relier
    # (tests/integration/schedule/test_periodic_models.py).
    "CELERY_BEAT_MODELS": env.bool("TESTPROJECT_CELERY_BEAT_MODELS", default=False),
}

# Django's task framework on relier (docs/django-tasks.md); the tasks of
# testproject/demo/jobs.py run on the same workers as the @rl_task ones.
TASKS = {
    "default": {
        "BACKEND": "relier_django.tasks.RelierBackend",
        "QUEUES": ["default", "emails"],
    }
}
# A worker imports an app's tasks.py by itself; any other module of tasks is named here.
CELERY_IMPORTS = [
    "testproject.demo.jobs",
    "testproject.demo.conformance_jobs",
    "testproject.demo.composition_tasks",  # the composition matrix's (tests/composition/)
    "testproject.demo.limit_tasks",  # flow control's (tests, chaos, bench/flow_control.py)
    "testproject.demo.bound_tasks",  # Celery's bound-task idioms (issue 39)
    "testproject.demo.progress_tasks",  # progress reporting's (tests/integration)
    "testproject.demo.bench_limit_tasks",  # bench/flow_control.py's throughput contender
    "testproject.demo.checkout",  # the crash-point example (docs/crash-testing.md)
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "relier_django": {
            "handlers": ["console"],
            "level": env.str("TESTPROJECT_LOG_LEVEL", default="INFO"),
            # Celery's worker also logs through the root logger: print each line once.
            "propagate": False,
        },
        # One line per commit, at DEBUG since it is per task: the chaos evidence
        # (chaos/evidence.py) and several tests read them from the workers' logs.
        "relier_django.runner": {"level": env.str("TESTPROJECT_RUNNER_LOG_LEVEL", default="DEBUG")},
    },
}

# A Celery beat entry naming an @rl_task, every DEMO_BEAT_EVERY_S seconds (0: none), for
# tests/integration/celery_compat/test_celery_native.py: beat's own apply_async must push it.
if env.float("DEMO_BEAT_EVERY_S", default=0):
    CELERY_BEAT_SCHEDULE = {
        "demo-beat": {
            "task": "demo.sync_record",
            "schedule": env.float("DEMO_BEAT_EVERY_S"),
            "args": ("beat",),
        }
    }

# A periodic entry that relier's scanners fire (docs/scheduling.md), every
# DEMO_PERIODIC_EVERY_S seconds (0: none), for tests/chaos/test_periodic.py.
if env.float("DEMO_PERIODIC_EVERY_S", default=0):
    CELERY_BEAT_SCHEDULE = {
        **globals().get("CELERY_BEAT_SCHEDULE", {}),
        "demo-periodic": {
            "task": "demo.sync_record",
            "schedule": env.float("DEMO_PERIODIC_EVERY_S"),
            "args": ("periodic",),
            "options": {"relier_missed": env.str("DEMO_PERIODIC_MISSED", default="all")},
        },
    }

# The chaos runner's periodic entry (chaos/scenarios/periodic.py): demo.chaos_scheduled
# every DEMO_CHAOS_PERIODIC_EVERY_S seconds (0: none), journaling each run, its tick
# (ctx.scheduled_at) and its start on the Redis clock to DEMO_CHAOS_PERIODIC_JOURNAL.
if env.float("DEMO_CHAOS_PERIODIC_EVERY_S", default=0):
    CELERY_BEAT_SCHEDULE = {
        **globals().get("CELERY_BEAT_SCHEDULE", {}),
        "chaos-periodic": {
            "task": "demo.chaos_scheduled",
            "schedule": env.float("DEMO_CHAOS_PERIODIC_EVERY_S"),
            "kwargs": {
                "label": "periodic",
                "journal": env.str("DEMO_CHAOS_PERIODIC_JOURNAL"),
                "work_s": env.float("DEMO_CHAOS_PERIODIC_WORK_S", default=0.0),
            },
        },
    }
