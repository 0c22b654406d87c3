"""System checks, by subject: relier's settings (``settings``), its Redis server
(``store``), Celery's broker (``broker``), Celery's serializers (``celery``) and the
tasks (``tasks``); ``common`` holds what they share.

Registered from ``RelierConfig.ready()`` under the tag ``relier``, so they run with
every ``manage.py check`` (and every command that runs checks) and can be selected
alone with ``manage.py check --tag relier``. docs/checks.md lists every id.

relier.W007 (an unknown ``RELIER_*`` environment variable) is a warning, not an
error: the variable may belong to something else that shares the prefix.

The Redis checks do I/O: one fail-fast client (about a one-second timeout, no
retries), a PING and one round trip of CONFIG GET (or INFO), so a missing Redis
delays a check by about a second, never more.
"""

from . import broker, celery, settings, store, tasks
from .common import TAG

__all__ = ["TAG", "broker", "celery", "settings", "store", "tasks"]
