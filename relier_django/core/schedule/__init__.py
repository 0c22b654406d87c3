"""Time: tasks that wait in Redis until they are due (countdown, eta, retries with a
backoff) and periodic ticks, dispatched by the scanner leader on the Redis clock.

``dispatch`` takes the due tasks of the schedule index and publishes them, fenced;
``periodic`` fires the ticks of Celery's ``beat_schedule`` entries that name an
``@rl_task``, each exactly once. Imports ``push`` (a tick is a push), ``dlq``,
``store``, ``broker`` and ``model``.
"""
