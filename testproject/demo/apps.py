from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "testproject.demo"
    label = "demo"
    verbose_name = "Demo tasks"

    def ready(self) -> None:
        from . import observers  # noqa: F401 - connects the signal receivers
