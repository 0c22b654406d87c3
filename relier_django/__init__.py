"""relier_django: Celery tasks that cannot be lost."""

__version__ = "0.1.0.dev0"
