"""relier's Redis clients open what their callers need: redis-py 8 caps a connection
pool at 100 by default, and a process's shared client serves every thread and every
task of an event loop, so a web process with more concurrent pushes would see some fail
with ``MaxConnectionsError``. Building a client connects to nothing."""

from __future__ import annotations

import pytest

from relier_django.core.model import config
from relier_django.core.store import connection

pytestmark = pytest.mark.unit


def _cfg(url: str = "redis://127.0.0.1:1/0") -> config.Config:
    return config.Config().replace(redis_url=url)


def test_the_shared_sync_and_async_clients_allow_many_more_than_redis_py_s_default():
    sync = connection._build_sync(_cfg(), fail_fast=False)
    assert sync.connection_pool.max_connections == connection.MAX_CONNECTIONS > 1000
    async_client, _ = connection._build_async(_cfg(), fail_fast=False)
    assert async_client.connection_pool.max_connections == connection.MAX_CONNECTIONS


def test_a_url_s_own_max_connections_wins():
    sync = connection._build_sync(_cfg("redis://127.0.0.1:1/0?max_connections=7"), False)
    assert sync.connection_pool.max_connections == 7
