"""One incarnation inside a Celery worker: the runner (verify, start, execute, commit,
retry or dead-letter), the fenced transitions it makes, heartbeats of running and
reserved tasks, timeouts, the task context, and the Celery signal hooks of a worker.

Imports ``recovery`` (a worker embeds the scanner), ``dlq``, ``store``, ``broker`` and
``model``; never ``push``.
"""
