"""The pytest fixtures: ``crashpoints`` and the private servers it runs on.

``crashpoints_redis`` (session): a private ``redis-server``. ``crashpoints_env``: what
the crash-testing worker's environment adds (the database the test's effects read,
e.g. ``{"DATABASE_URL": ...}``); override it in a ``conftest.py``.
``crashpoints_celery_app``: the ``-A`` argument of the worker (default: the main name
of the task's Celery app). ``crashpoints``: a :class:`CrashPoints`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from .. import conf
from .explore import EffectSpec, Explorer, effects_of
from .report import Report
from .servers import FAST_RECOVERY, CrashWorker, PrivateRedis

_POINTED = ("RELIER_REDIS_URL", "CELERY_BROKER_URL")


@contextlib.contextmanager
def _pointed_at(url: str, app: Any) -> Iterator[None]:
    """This process's relier config and ``app`` use ``url``, then what they used."""
    saved = {name: os.environ.get(name) for name in _POINTED}
    broker = app.conf.broker_url
    os.environ.update(dict.fromkeys(_POINTED, url))
    _reconnect(app, url)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reconnect(app, broker)


def _reconnect(app: Any, broker_url: str) -> None:
    import kombu.pools

    conf.clear_cache()
    app.conf.broker_url = broker_url
    # Celery's pools live in kombu's registry, keyed by URL: drop them all, and the
    # app's queues and router, built from the conf of their moment.
    kombu.pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    for cached in ("queues", "router"):
        vars(app.amqp).pop(cached, None)


class CrashPoints:
    """Kills a task's incarnation at every boundary it crosses and checks that it still
    commits exactly once, with each named effect exactly as often as expected.

    Attributes:
        env: added to the worker's environment (set it before the first call).
        timeout_s: how long one run may take to commit, kill and recovery included.
    """

    def __init__(
        self, redis: PrivateRedis, directory: Path, env: Mapping[str, str],
        celery_app: str | None, timeout_s: float = 60,
    ) -> None:  # fmt: skip
        self.redis, self.directory = redis, directory
        self.env = dict(env)
        self.celery_app = celery_app
        self.timeout_s = timeout_s
        self._worker: CrashWorker | None = None

    def __call__(
        self, task: Any, *args: Any, effects: Mapping[str, EffectSpec] | None = None,
        check: bool = True, **kwargs: Any,
    ) -> Report:  # fmt: skip
        """Explore ``task(*args, **kwargs)``: one run without a kill, then one run per
        boundary it crossed, killed there (SIGKILL of its pool process) and recovered by
        relier.

        Args:
            task: an ``@rl_task`` (a plain ``def`` or an ``async def`` one).
            effects: name → a callable returning how many times the effect has happened
                so far (rows, calls to a fake), or ``(callable, expected)``; expected
                once per run unless given. Read in the test's process, before and after
                each run.
            check: raise when a run broke a promise (else only return the report).

        Returns:
            The report (also printed): per boundary, the commits and each effect's count.

        Raises:
            AssertionError: with ``check``, some run did not commit exactly once or an
                effect's count was not the expected one; the message is the report,
                naming the boundary ("effect 'charges' happened 2 times after a kill at
                'before commit.lua' (expected 1)").
        """
        wanted = effects_of(effects)
        worker = self._started(task)
        with _pointed_at(self.redis.url, task.app):
            report = Explorer(worker.directory, self.timeout_s).explore(task, args, kwargs, wanted)
        print(report)  # pytest shows it with the test's output
        return report.check() if check else report

    def _started(self, task: Any) -> CrashWorker:
        if self._worker is None:
            path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
            url = self.redis.url
            env = {**FAST_RECOVERY, "PYTHONPATH": path, **self.env,
                   "RELIER_REDIS_URL": url, "CELERY_BROKER_URL": url}  # fmt: skip
            app = self.celery_app or str(task.app.main)
            self._worker = CrashWorker(app, self.directory / "worker", env)
            self._worker.start()
        return self._worker

    def close(self) -> None:
        """Stop the worker (by its PID), if one was started."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


@pytest.fixture(scope="session")
def crashpoints_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """A private ``redis-server`` for the session's crash-point tests."""
    server = PrivateRedis(tmp_path_factory.mktemp("crashpoints-redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def crashpoints_env() -> dict[str, str]:
    """Added to the crash-testing worker's environment: override to point it at the
    database the test's effects read."""
    return {}


@pytest.fixture
def crashpoints_celery_app() -> str | None:
    """The worker's ``-A`` argument; None: the main name of the task's Celery app."""
    return None


@pytest.fixture
def crashpoints(
    crashpoints_redis: PrivateRedis, crashpoints_env: dict[str, str],
    crashpoints_celery_app: str | None, tmp_path: Path,
) -> Iterator[CrashPoints]:  # fmt: skip
    """A :class:`CrashPoints`; its worker starts at the first call and stops after."""
    found = CrashPoints(crashpoints_redis, tmp_path / "crashpoints", crashpoints_env,
                        crashpoints_celery_app)  # fmt: skip
    try:
        yield found
    finally:
        found.close()


__all__ = ["CrashPoints", "crashpoints", "crashpoints_celery_app", "crashpoints_env",
           "crashpoints_redis"]  # fmt: skip
