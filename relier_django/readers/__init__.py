"""What the admin pages, the management commands, the system checks and the metrics
endpoint read, wired to the settings and the Celery app once: the scheduled listings,
one task read by id, the task modules' discovery, and how times and histories are
written for people. Imports the core, ``conf`` and the ``dlq`` door; never the admin
nor a command, which both build on it."""
