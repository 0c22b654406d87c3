"""Celery's broker transport for workers that run relier_django tasks (see
:mod:`relier_django.core.transport`)::

    CELERY_BROKER_TRANSPORT = "relier_django.transport:Transport"  # redis://
    CELERY_BROKER_TRANSPORT = "relier_django.transport:SentinelTransport"  # sentinel://
"""

from .core.transport import SentinelTransport, Transport, is_relier_message

__all__ = ["SentinelTransport", "Transport", "is_relier_message"]
