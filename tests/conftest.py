"""Fixtures: a private redis-server and PostgreSQL per session, per-test flushing, real
Celery workers.

No fixture here ever connects to a server the suite did not start: the session's
Redis and PostgreSQL get free ports and temp dirs, and workers run in their own process
groups so that every signal reaches only processes the test started.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from testproject.harness import (
    QUICK_REDIS_RETRY_ENV,
    CeleryWorker,
    RedisServer,
    free_port,
    reset_celery_connections,
)
from testproject.lostreply import LostReplyProxy
from testproject.postgres import PostgresServer
from testproject.shared_db import SharedDatabase

pytest_plugins = [
    "tests.rabbit",  # the rabbit_server fixture: a private RabbitMQ node
    "relier_django.crashpoints",  # crash-point tests of user tasks (docs/crash-testing.md)
]

TESTS_DIR = Path(__file__).resolve().parent
POSTGRES_URL_ENV = "TESTPROJECT_POSTGRES_URL"
_POSTGRES = pytest.StashKey[PostgresServer]()
_POSTGRES_URL_BEFORE = pytest.StashKey[str | None]()

_TIER_BY_DIR = {
    "unit": "unit",
    "integration": "integration",
    "chaos": "chaos",
    "browser": "browser",
    "cluster": "cluster",
    "tooling": "tooling",
}


def pytest_configure(config: pytest.Config) -> None:
    """Start the session's private PostgreSQL and make it the "pg" database, before any
    test module is imported (test_on_commit.py reads the databases at import).

    ``TESTPROJECT_POSTGRES_URL=""`` turns it off; any other value it had is replaced, as
    the session's Redis replaces ``RELIER_REDIS_URL``: the suite never uses a PostgreSQL
    it did not start. A missing server binary fails the run, it never skips.
    """
    if config.getoption("help"):
        return
    _fast_password_hashing()
    if os.environ.get(POSTGRES_URL_ENV) == "":
        return
    server = PostgresServer().start()
    config.stash[_POSTGRES] = server
    config.stash[_POSTGRES_URL_BEFORE] = os.environ.get(POSTGRES_URL_ENV)
    _point_databases_at(server.url)


def _fast_password_hashing() -> None:
    """Django's default hasher (PBKDF2, a million rounds) costs about a second per user a
    test creates with a password, and the admin tests create one or more each. The
    passwords are throw-away: MD5, as Django's testing docs advise. Set before any
    password is hashed, so Django's cached hasher list is built from it."""
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_POSTGRES, None)
    if server is None:
        return
    server.stop()
    before = config.stash[_POSTGRES_URL_BEFORE]
    if before is None:
        os.environ.pop(POSTGRES_URL_ENV, None)
    else:
        os.environ[POSTGRES_URL_ENV] = before


def pytest_report_header(config: pytest.Config) -> list[str]:
    from tests.composition import sampling

    plan = sampling.plan()  # drawn once per process: the composition test uses the same
    composition = (
        f"composition matrix: seed {plan.seed}, {plan.size or 'every'} cell(s) "
        f"(repeat: {plan.repeat()})"
    )
    server = config.stash.get(_POSTGRES, None)
    if server is None:
        return [
            f"PostgreSQL: off ({POSTGRES_URL_ENV} is empty); on_commit tests on SQLite only",
            composition,
        ]
    return [f"PostgreSQL: private server on 127.0.0.1:{server.port}, pid {server.pid}", composition]


def _point_databases_at(url: str) -> None:
    """Make the "pg" database of this process, and of the workers it starts, ``url``.

    pytest-django imports the settings before any conftest runs, so the alias is added
    to them here, as ``_point_process_at`` does for Redis; workers read the environment.
    """
    import environ
    from django.conf import settings
    from django.db import connections

    os.environ[POSTGRES_URL_ENV] = url
    settings.DATABASES["pg"] = environ.Env.db_url_config(url)
    # django.setup() already made the handler read DATABASES: let it fill in Django's
    # defaults (ATOMIC_REQUESTS, TEST, ...) for the new alias, as it did for the others.
    connections.settings = connections.configure_settings(settings.DATABASES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier from the directory it lives in."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS_DIR).parts
        if parts and parts[0] in _TIER_BY_DIR:
            item.add_marker(getattr(pytest.mark, _TIER_BY_DIR[parts[0]]))


def _point_process_at(url: str) -> None:
    """Make this test process (Django settings, relier config, Celery app) use ``url``.

    pytest-django imports the settings before any fixture runs, so the private
    server's URL is applied here rather than through the environment alone. The
    environment is set too, for worker subprocesses and for ``relier_django.conf``.
    """
    from django.conf import settings

    from relier_django import conf
    from testproject.celery import app as celery_app

    os.environ["RELIER_REDIS_URL"] = url
    os.environ["CELERY_BROKER_URL"] = url
    settings.RELIER_REDIS_URL = url
    settings.RELIER = {**getattr(settings, "RELIER", {}), "REDIS_URL": url}
    conf.get_config.cache_clear()
    celery_app.conf.broker_url = url
    # Drop any broker connection made before this point; Celery rebuilds its pools lazily.
    reset_celery_connections(celery_app)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server for the session: AOF everysec, noeviction, stopped by PID."""
    server = RedisServer(directory=tmp_path_factory.mktemp("redis")).start()
    _point_process_at(server.url)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client on the private server, flushed before the test: per-test isolation."""
    client = redis_server.client()
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def postgres_server(pytestconfig: pytest.Config) -> Iterator[PostgresServer]:
    """The session's private PostgreSQL (the "pg" database's), stopped by PID; with
    ``TESTPROJECT_POSTGRES_URL=""``, one of this fixture's own for the session."""
    server = pytestconfig.stash.get(_POSTGRES, None)
    if server is not None:
        yield server
        return
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "pg"])
def shared_db(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_server: PostgresServer
) -> Iterator[SharedDatabase]:
    """A migrated database shared by the test and the workers and producers it starts
    (pass ``shared_db.env()`` as their ``extra_env``): on SQLite, then on PostgreSQL
    (testproject/shared_db.py). Dropped after the test."""
    db = SharedDatabase.create(request.param, tmp_path, postgres_server)
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def relier_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Captures relier_django's log records (its logger does not propagate to root)."""
    logger = logging.getLogger("relier_django")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="relier_django")
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


WorkerFactory = Callable[..., CeleryWorker]


@pytest.fixture
def worker_factory(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[WorkerFactory]:
    """Start real ``celery -A testproject worker`` processes; all are SIGKILLed at teardown.

    Not a warm shutdown: Celery's prefork pool takes about two seconds to wind down, and
    after the test nothing depends on how the worker ends (a test that does stops it
    itself). The next test flushes Redis before it starts.

    Keyword arguments go to :class:`CeleryWorker` (``name``, ``concurrency``,
    ``queues``, ``extra_env``, ``extra_args``).
    """
    started: list[CeleryWorker] = []

    def start(**kwargs: object) -> CeleryWorker:
        kwargs.setdefault("name", f"w{len(started) + 1}")
        worker = CeleryWorker(redis_url=redis_server.url, log_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()
        for worker in started:
            # Shown by pytest only when the test failed.
            print(f"----- log of worker {worker.name} -----\n{worker.log_text()[-6000:]}")


@pytest.fixture
def worker(worker_factory: WorkerFactory) -> CeleryWorker:
    """One real prefork worker, concurrency 2, on the private Redis."""
    return worker_factory()


@pytest.fixture
def lost_reply(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[LostReplyProxy]:
    """A proxy in front of the session's Redis (flushed, as ``redis_client`` does) that
    can lose a script's reply; ``config_through(proxy)`` points relier's clients at it.
    See testproject/lostreply.py. A frame the proxy could not parse fails the test."""
    with LostReplyProxy(redis_server.url) as proxy:
        yield proxy
    assert not proxy.protocol_errors, f"the proxy met malformed RESP: {proxy.protocol_errors}"


@pytest.fixture
def quick_redis_retry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's relier clients with their retry budget (``REDIS_RETRY_S``) cut to
    nothing (``QUICK_REDIS_RETRY_ENV``): a connection error is raised at the first
    refusal, not after 3.75 s or more per call. For the tests of what an unreachable
    Redis is answered with; never for those of the budget itself. Restored after."""
    from relier_django import conf

    for name, value in QUICK_REDIS_RETRY_ENV.items():
        monkeypatch.setenv(name, value)  # the environment wins over settings
    conf.get_config.cache_clear()
    try:
        yield
    finally:
        monkeypatch.undo()
        conf.get_config.cache_clear()


@pytest.fixture
def redis_down(quick_redis_retry: None, monkeypatch: pytest.MonkeyPatch, settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """relier pointed at a Redis nobody listens at (a free port), with its retry budget
    cut to nothing (``quick_redis_retry``): a test of how a page or a command answers an
    unreachable Redis need not wait the budget out (3.75 s or more per call). Yields the
    URL. The environment and the settings are restored after the test."""
    from relier_django import conf

    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("RELIER_REDIS_URL", url)  # the environment wins over settings
    settings.RELIER = {**settings.RELIER, "REDIS_URL": url, "REDIS_RETRY_S": 0}
    conf.get_config.cache_clear()
    try:
        yield url
    finally:
        monkeypatch.undo()
        conf.get_config.cache_clear()
