"""The session's private RabbitMQ node (testproject/rabbitmq.py), as a pytest plugin that
tests/conftest.py loads with ``pytest_plugins``.

The node starts when a test first asks for it, so a run without RabbitMQ tests pays
nothing for it. A missing ``rabbitmq-server`` fails that test, it never skips it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testproject.rabbitmq import RabbitServer


@pytest.fixture(scope="session")
def rabbit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitServer]:
    """One private RabbitMQ node for the session (no plugins, user ``guest`` over
    127.0.0.1, ports and epmd of its own), stopped by PID. Its default vhost is shared by
    the session's tests: each names its queues after itself."""
    with RabbitServer(tmp_path_factory.mktemp("rabbitmq")) as server:
        yield server
