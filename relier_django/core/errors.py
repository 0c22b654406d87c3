"""Every exception relier_django raises derives from :class:`RelierError`."""

from __future__ import annotations


class RelierError(Exception):
    """Root of relier_django's exceptions."""


class ConfigError(RelierError, ValueError):
    """A setting has a value that cannot work. The Django layer re-raises it as
    ``ImproperlyConfigured``."""
