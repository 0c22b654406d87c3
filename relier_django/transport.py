"""Celery's broker transport for workers that run relier_django tasks (see
:mod:`relier_django.core.broker.redis_channel`)::

    CELERY_BROKER_TRANSPORT = "relier_django.transport:Transport"  # redis://
    CELERY_BROKER_TRANSPORT = "relier_django.transport:SentinelTransport"  # sentinel://
"""

from .core.broker.marker import is_relier_message
from .core.broker.redis_channel import SentinelTransport, Transport

__all__ = ["SentinelTransport", "Transport", "is_relier_message"]
