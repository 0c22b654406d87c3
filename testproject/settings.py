"""Settings for the testproject: the model for what a relier_django user writes.

Everything that differs between machines comes from the environment through
django-environ; the defaults run the demo on one machine with no set-up.
"""

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
]

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

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# --- Redis, Celery and relier_django ----------------------------------------------
# 6391 is the private Redis that `make demo` starts in ./.run; tests and chaos runs
# always pass their own URLs. Production sets RELIER_REDIS_URL.
RELIER_REDIS_URL = env.str("RELIER_REDIS_URL", default="redis://127.0.0.1:6391/0")

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=RELIER_REDIS_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True
# Off by default, as in Celery; the delivery benchmark turns them on for its
# "acks_late" contender.
CELERY_TASK_ACKS_LATE = env.bool("CELERY_TASK_ACKS_LATE", default=False)
CELERY_TASK_REJECT_ON_WORKER_LOST = env.bool("CELERY_TASK_REJECT_ON_WORKER_LOST", default=False)
CELERY_WORKER_PREFETCH_MULTIPLIER = env.int("CELERY_WORKER_PREFETCH_MULTIPLIER", default=4)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # How long kombu's Redis transport waits before redelivering an unacknowledged
    # message, and how often it looks (every interval x throttle seconds).
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    "unacked_restore_interval": env.float("CELERY_UNACKED_RESTORE_INTERVAL", default=10),
    "unacked_restore_throttle": env.int("CELERY_UNACKED_RESTORE_THROTTLE", default=10),
}

RELIER = {
    "REDIS_URL": RELIER_REDIS_URL,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "relier_django": {
            "handlers": ["console"],
            "level": env.str("RELIER_LOG_LEVEL", default="INFO"),
            # Celery's worker also logs through the root logger: print each line once.
            "propagate": False,
        }
    },
}
