from django.apps import AppConfig


class RelierConfig(AppConfig):
    name = "relier_django"
    label = "relier_django"
    verbose_name = "Relier"

    def ready(self) -> None:
        # Only wiring here, no I/O: hand the core a way to read Django settings lazily.
        from . import conf

        conf.install()
