from django.apps import AppConfig


class RelierConfig(AppConfig):
    name = "relier_django"
    label = "relier_django"
    verbose_name = "Relier"

    def ready(self) -> None:
        # Only wiring here, no I/O: hand the core a way to read Django settings lazily,
        # and register the system checks (importing the module registers them).
        from . import checks, conf  # noqa: F401

        conf.install()
        from .db import transactions

        transactions.install()  # push() inside atomic() waits for the commit
        from .db import outbox

        outbox.install()  # ... and writes into the outbox when RELIER["OUTBOX"] is on
        from .core.recovery import scanner

        # The scanner leader (in workers and relier_resurrector) relays the outbox.
        scanner.add_leader_duty("outbox relay", outbox.Relay)
        from .db import inbox

        inbox.install()  # @rl_task(atomic=...) bodies run with the fenced inbox
        from .db import celery_beat

        celery_beat.install()  # django-celery-beat's rows, read when CELERY_BEAT_MODELS is on
        from . import signals

        signals.install()  # the core's events as Django signals (task_dead_lettered, ...)
