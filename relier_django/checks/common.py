"""What every subject's checks share: the tag, and the messages for a server that cannot be
reached or verified."""

from __future__ import annotations

import redis
import redis.connection
from django.core.checks import CheckMessage
from django.core.checks import Warning as CheckWarning

TAG = "relier"
"""The check tag: ``manage.py check --tag relier`` runs only these checks."""


OPT_OUT = "RELIER['ALLOW_UNSAFE_REDIS'] = True silences this on a development server"


PICKLE = ("pickle", "application/x-python-serialize")


LOOPBACK = ("localhost", "127.0.0.1", "::1")


def unreachable(where: str, exc: Exception) -> CheckMessage:
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return CheckWarning(
            f"Redis at {where} refused relier's credentials ({exc}); its persistence and "
            "eviction settings were not checked.",
            hint="Correct the user or password in RELIER['REDIS_URL'] (or RELIER_REDIS_URL, "
            "which wins). Until Redis accepts them, push() fails and workers refuse to start.",
            id="relier.W001",
        )
    return CheckWarning(
        f"Redis at {where} is unreachable: it did not answer a PING ({exc}); its "
        "persistence and eviction settings were not checked.",
        hint="Start that Redis, or point RELIER['REDIS_URL'] (or RELIER_REDIS_URL, which "
        "wins) at the right one. Until it answers, push() fails and workers refuse to start.",
        id="relier.W001",
    )


def unverifiable(where: str, why: str) -> CheckMessage:
    return CheckWarning(
        f"Could not verify the persistence and eviction settings of Redis at {where}: {why}.",
        hint="Make sure the server runs with appendonly yes, appendfsync everysec and "
        "maxmemory-policy noeviction (on a managed Redis: its parameter group), then add "
        "'relier.W002' to SILENCED_SYSTEM_CHECKS; or grant this user CONFIG GET or INFO.",
        id="relier.W002",
    )
