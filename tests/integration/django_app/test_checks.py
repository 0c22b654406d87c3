"""G6: misconfiguration fails ``manage.py check`` with an id and the exact fix.

Every Redis here is a private ``redis-server`` started with the wrong setting under
test (AOF off, an evicting policy, CONFIG renamed, an ACL user without CONFIG and
INFO) or a free port nothing listens on; none is the session's server.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import current_app
from django.core.checks import CheckMessage, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from relier_django import conf
from relier_django.core.model.spec import TaskSpec
from relier_django.core.task import RelierTask
from testproject.harness import (
    QUICK_REDIS_RETRY_ENV,
    REPO_ROOT,
    CeleryWorker,
    RedisServer,
    free_cluster_port,
    free_port,
    worker_env,
)

StartRedis = Callable[..., RedisServer]


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[StartRedis]:
    """Start private servers with extra ``redis-server`` arguments; stopped by PID."""
    started: list[RedisServer] = []

    def start(*extra_args: str) -> RedisServer:
        directory = tmp_path / f"redis-{len(started)}"
        server = RedisServer(directory=directory, extra_args=extra_args).start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def relier(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Apply ``settings.RELIER`` (and optionally CACHES) for one test.

    The session's ``RELIER_REDIS_URL`` would win over the dict, so it is removed;
    ``override_settings`` fires ``setting_changed``, which drops relier's cached config
    on the way in and on the way out.
    """
    monkeypatch.delenv("RELIER_REDIS_URL", raising=False)
    # Celery reads CELERY_BROKER_URL from the environment before its conf: gone, so the
    # conf's broker_url (set below, and by the broker tests) is the one checked.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    broker_url = current_app.conf.broker_url
    with contextlib.ExitStack() as stack:

        def apply(caches: dict | None = None, **relier_settings: object) -> None:
            extra = {"CACHES": caches} if caches is not None else {}
            stack.enter_context(override_settings(RELIER=relier_settings, **extra))
            # Celery's broker on relier's server, as the testproject has it: the broker
            # check (relier.W001/E003/E004 for the broker) has its own tests below.
            with contextlib.suppress(ImproperlyConfigured):
                current_app.conf.broker_url = conf.get_config().redis_url

        try:
            yield apply
        finally:
            current_app.conf.broker_url = broker_url


@pytest.fixture
def celery_conf() -> Iterator[object]:
    """The current Celery app's conf; every key a test sets is restored afterwards."""
    app_conf = current_app.conf
    saved = {
        key: app_conf[key]
        for key in (
            "task_serializer",
            "accept_content",
            "task_routes",
            "task_queues",
            "broker_url",
            "broker_transport",
            "imports",
            "broker_transport_options",
            "task_default_queue_type",
        )
    }
    try:
        yield app_conf
    finally:
        app_conf.update(saved)


@pytest.fixture
def register_task() -> Iterator[Callable[[TaskSpec], RelierTask]]:
    """Register a RelierTask built straight from a TaskSpec (not through @rl_task)."""
    names: list[str] = []

    def register(spec: TaskSpec) -> RelierTask:
        app = current_app._get_current_object()
        task = app.task(name=spec.name, base=RelierTask, bind=True, shared=False, relier_spec=spec)(
            spec.fn
        )
        names.append(spec.name)
        return app.tasks[task.name]

    try:
        yield register
    finally:
        for name in names:
            current_app.tasks.unregister(name)


def relier_messages() -> list[CheckMessage]:
    return [m for m in run_checks(tags=["relier"]) if (m.id or "").startswith("relier.")]


def ids() -> list[str]:
    return sorted(m.id for m in relier_messages())


def by_id(wanted: str) -> CheckMessage:
    matches = [m for m in relier_messages() if m.id == wanted]
    assert len(matches) == 1, relier_messages()
    return matches[0]


async def _async_body(ctx: object) -> None:
    return None


# --- Redis ----------------------------------------------------------------------------


def test_a_durable_non_evicting_server_passes_every_check(start_redis, relier):
    relier(REDIS_URL=start_redis().url)
    assert relier_messages() == []
    call_command("check", "--tag", "relier", verbosity=0)  # raises on any error


def test_aof_off_is_an_error_that_gives_the_redis_conf_lines(start_redis, relier):
    relier(REDIS_URL=start_redis("--appendonly", "no").url)
    error = by_id("relier.E003")
    assert error.is_serious()
    assert "appendonly yes" in error.hint and "appendfsync everysec" in error.hint
    assert "ALLOW_UNSAFE_REDIS" in error.hint
    with pytest.raises(SystemCheckError, match=r"relier\.E003"):
        call_command("check", verbosity=0)


def test_an_evicting_policy_is_an_error_that_gives_the_config_set_line(start_redis, relier):
    relier(REDIS_URL=start_redis("--maxmemory-policy", "allkeys-lru").url)
    error = by_id("relier.E004")
    assert "'allkeys-lru'" in error.msg
    assert "maxmemory-policy noeviction" in error.hint
    assert "CONFIG SET maxmemory-policy noeviction" in error.hint


def test_appendfsync_no_is_a_warning(start_redis, relier):
    relier(REDIS_URL=start_redis("--appendfsync", "no").url)
    warning = by_id("relier.W004")
    assert not warning.is_serious() and "appendfsync everysec" in warning.hint


def test_celerys_broker_on_another_redis_is_held_to_the_same_rules(start_redis, relier):
    store = start_redis()
    broker = start_redis("--appendonly", "no", "--maxmemory-policy", "allkeys-lru")
    relier(REDIS_URL=store.url)
    current_app.conf.broker_url = broker.url  # the fixture restores it
    aof, evicting = by_id("relier.E003"), by_id("relier.E004")
    assert f"127.0.0.1:{broker.port}" in aof.msg and "Celery's broker" in aof.msg
    assert "QUEUED_GRACE_S" in aof.msg and "plain Celery tasks are lost" in aof.msg
    assert "Celery's broker" in evicting.msg and "'allkeys-lru'" in evicting.msg
    assert "maxmemory-policy noeviction" in evicting.hint
    # Another database of relier's own server is the server check_redis already checked.
    current_app.conf.broker_url = store.url.rsplit("/", 1)[0] + "/3"
    assert relier_messages() == []
    current_app.conf.broker_url = f"redis://127.0.0.1:{free_port()}/0"
    assert "Celery's broker" in by_id("relier.W001").msg and "CELERY_BROKER_URL" in (
        by_id("relier.W001").hint
    )


def test_the_development_opt_out_silences_the_durability_checks(start_redis, relier, monkeypatch):
    server = start_redis("--appendonly", "no", "--maxmemory-policy", "allkeys-lru")
    relier(REDIS_URL=server.url)
    assert ids() == ["relier.E003", "relier.E004"]
    relier(REDIS_URL=server.url, ALLOW_UNSAFE_REDIS=True)
    assert ids() == []
    # The environment wins over the dict, for this key as for the others.
    monkeypatch.setenv("RELIER_ALLOW_UNSAFE_REDIS", "false")
    conf.clear_cache()
    assert ids() == ["relier.E003", "relier.E004"]
    monkeypatch.delenv("RELIER_ALLOW_UNSAFE_REDIS")
    conf.clear_cache()


def test_with_config_renamed_the_settings_are_read_from_info(start_redis, relier):
    # Managed Redis services rename CONFIG but answer INFO, which knows both settings.
    relier(REDIS_URL=start_redis("--rename-command", "CONFIG", "").url)
    assert ids() == []
    relier(REDIS_URL=start_redis("--rename-command", "CONFIG", "", "--appendonly", "no").url)
    assert ids() == ["relier.E003"]


def test_when_config_and_info_are_refused_it_warns_that_it_could_not_verify(start_redis, relier):
    server = start_redis("--rename-command", "CONFIG", "")
    admin = server.client()
    admin.acl_setuser(
        "app", enabled=True, passwords=["+s3cret"], keys=["*"], categories=["+@all"],
        commands=["-info"],
    )  # fmt: skip
    admin.close()
    relier(REDIS_URL=f"redis://app:s3cret@127.0.0.1:{server.port}/0")
    warning = by_id("relier.W002")
    assert ids() == ["relier.W002"]  # a warning: `manage.py check` still passes
    assert "could not verify" in warning.msg.lower()
    assert "redis://app:***@127.0.0.1" in warning.msg and "s3cret" not in warning.msg
    assert "SILENCED_SYSTEM_CHECKS" in warning.hint


def test_a_user_that_may_not_list_clients_is_warned_that_deaths_wait_for_the_ttl(
    start_redis, relier
):
    server = start_redis()
    admin = server.client()
    admin.acl_setuser(
        "app", enabled=True, passwords=["+s3cret"], keys=["*"], channels=["*"],
        categories=["+@all"], commands=["-client|list"],
    )  # fmt: skip
    admin.close()
    relier(REDIS_URL=f"redis://app:s3cret@127.0.0.1:{server.port}/0")
    warning = by_id("relier.W006")
    assert ids() == ["relier.W006"]
    assert "HEARTBEAT_TTL_S" in warning.msg and "+client|list" in warning.hint


def test_an_unreachable_redis_is_a_quick_warning_not_a_crash(relier):
    relier(REDIS_URL=f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    warning = by_id("relier.W001")
    assert time.monotonic() - started < 5
    assert "redis://:***@127.0.0.1" in warning.msg and "hunter2" not in warning.msg
    assert "RELIER_REDIS_URL" in warning.hint
    call_command("check", verbosity=0)  # a warning does not fail the command


# --- settings -------------------------------------------------------------------------


def test_heartbeat_refresh_not_below_the_ttl_is_an_error_not_a_traceback(relier):
    relier(HEARTBEAT_TTL_S=3, HEARTBEAT_INTERVAL_S=3)
    error = by_id("relier.E002")
    assert "HEARTBEAT_INTERVAL_S (3)" in error.msg and "HEARTBEAT_TTL_S (3)" in error.msg
    assert "e.g. 1 " in error.hint
    assert ids() == ["relier.E002"]  # the Redis and task checks do not pile on
    with pytest.raises(SystemCheckError, match=r"relier\.E002"):
        call_command("check", verbosity=0)


def test_any_other_invalid_setting_is_reported_with_its_message(relier):
    relier(HEARTBEAT_TLL_S=3)
    error = by_id("relier.E001")
    assert "HEARTBEAT_TLL_S" in error.msg and "HEARTBEAT_TTL_S" in error.msg
    relier(REDIS_URL="127.0.0.1:6379")
    assert "redis://" in by_id("relier.E001").hint
    relier(REDIS_URL="redis://127.0.0.1:abc/0")  # a port that is not a number
    assert "not a usable" in by_id("relier.E001").msg


def test_every_bad_setting_is_its_own_e001_at_once(relier):
    relier(HEARTBEAT_TTL=3, MAX_RETRIES="lots", RESURRECT_BATCH=0)
    errors = [m for m in relier_messages() if m.id == "relier.E001"]
    assert [e.msg for e in errors] == [
        "settings.RELIER has an unknown key 'HEARTBEAT_TTL' (did you mean 'HEARTBEAT_TTL_S'?)",
        "settings.RELIER['MAX_RETRIES'] must be an int, got 'lots'",
        "settings.RELIER['RESURRECT_BATCH'] must be >= 1",
    ]
    assert ids() == ["relier.E001"] * 3  # the Redis and task checks do not pile on


def test_every_value_config_refuses_is_reported_by_its_setting_name(relier, monkeypatch):
    monkeypatch.setenv("RELIER_SCAN_INTERVAL_S", "0")
    relier(RESURRECT_BATCH=0, MAX_RETRIES=-1, HEARTBEAT_INTERVAL_S=20)
    errors = [m for m in relier_messages() if m.id == "relier.E001"]
    assert "HEARTBEAT_INTERVAL_S (20) is not below" in by_id("relier.E002").msg
    assert sorted(e.msg for e in errors) == sorted([
        "settings.RELIER['RESURRECT_BATCH'] must be >= 1",
        "the environment variable RELIER_SCAN_INTERVAL_S must be > 0",
        "settings.RELIER['MAX_RETRIES'] must be >= 0",
    ]) or errors  # fmt: skip
    # The hint points at the published settings page: the docs are not in the package.
    assert "https://github.com/relier-django/relier-django/blob/main/docs/settings.md" in (
        errors[0].hint
    )


def test_a_misspelled_environment_variable_is_a_warning_naming_the_setting(
    start_redis, relier, monkeypatch, caplog
):
    monkeypatch.setenv("RELIER_HEARTBEAT_TTL", "3")
    relier(REDIS_URL=start_redis().url)
    warning = by_id("relier.W007")
    assert "RELIER_HEARTBEAT_TTL is not a relier setting" in warning.msg
    assert "did you mean RELIER_HEARTBEAT_TTL_S?" in warning.msg
    assert ids() == ["relier.W007"]
    # A worker runs no checks: loading the settings logs it too.
    conf.clear_cache()
    with caplog.at_level("WARNING", logger="relier_django.conf"):
        conf.get_config()
    assert "RELIER_HEARTBEAT_TTL is not a relier setting" in caplog.text


def test_a_badly_typed_secret_is_reported_without_its_value(relier):
    relier(SIGNING_KEYS=b"top-secret-key")  # bytes, not a list of strings
    error = by_id("relier.E001")
    assert "SIGNING_KEYS" in error.msg and "top-secret-key" not in error.msg


# --- REDIS_CACHE_ALIAS ----------------------------------------------------------------


def _cache(backend: str, location: object, **options: object) -> dict:
    return {"default": {"BACKEND": backend, "LOCATION": location, "OPTIONS": options}}


@pytest.mark.parametrize(
    ("backend", "password_option"),
    [
        ("django_redis.cache.RedisCache", "PASSWORD"),
        ("django.core.cache.backends.redis.RedisCache", "password"),
    ],
)
def test_redis_cache_alias_reuses_the_cache_server_and_its_password(
    start_redis, relier, backend, password_option
):
    server = start_redis()
    admin = server.client()
    admin.config_set("requirepass", "p@ss/word")
    admin.close()
    location = [f"redis://127.0.0.1:{server.port}/2", "redis://127.0.0.1:1/0"]  # writer first
    caches = _cache(backend, location, **{password_option: "p@ss/word"})
    relier(caches=caches, REDIS_CACHE_ALIAS="default")
    assert conf.get_config().redis_url == f"redis://:p%40ss%2Fword@127.0.0.1:{server.port}/2"
    assert relier_messages() == []  # the checks reached the server with that password


def test_redis_cache_alias_and_redis_url_together_are_refused(relier):
    caches = _cache("django_redis.cache.RedisCache", "redis://127.0.0.1:1/0")
    relier(caches=caches, REDIS_CACHE_ALIAS="default", REDIS_URL="redis://127.0.0.1:1/0")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL or REDIS_CACHE_ALIAS, not both"):
        conf.get_config()
    assert "not both" in by_id("relier.E001").msg


@pytest.mark.parametrize(
    ("caches", "alias", "says"),
    [
        (_cache("django_redis.cache.RedisCache", "redis://x/0"), "sessions", "no such alias"),
        (
            _cache("django.core.cache.backends.locmem.LocMemCache", "x"),
            "default",
            "relier can reuse only",
        ),
        (
            _cache(
                "django_redis.cache.RedisCache",
                ["redis://a/0", "redis://b/0"],
                CLIENT_CLASS="django_redis.client.ShardClient",
            ),
            "default",
            "CLIENT_CLASS",
        ),
    ],
    ids=["unknown-alias", "not-redis", "sharded"],
)
def test_a_cache_alias_relier_cannot_use_is_a_clear_error(relier, caches, alias, says):
    relier(caches=caches, REDIS_CACHE_ALIAS=alias)
    with pytest.raises(ImproperlyConfigured, match=says) as raised:
        conf.get_config()
    assert "REDIS_URL" in str(raised.value)  # the way out is named
    assert by_id("relier.E001").msg == str(raised.value)


# --- Celery and the tasks -------------------------------------------------------------


def test_pickle_anywhere_in_celerys_serializers_is_an_error(start_redis, relier, celery_conf):
    relier(REDIS_URL=start_redis().url)
    celery_conf.task_serializer = "pickle"
    celery_conf.accept_content = ["json", "pickle"]
    errors = [m for m in relier_messages() if m.id == "relier.E005"]
    assert [e.msg.split(":")[0] for e in errors] == [
        "Celery's task_serializer is 'pickle'",
        "Celery's accept_content ['json', 'pickle'] includes pickle",
    ]
    assert "CELERY_ACCEPT_CONTENT" in errors[1].hint and "['json']" in errors[1].hint


def test_the_testprojects_transport_passes(start_redis, relier):
    relier(REDIS_URL=start_redis().url)
    assert not [m for m in relier_messages() if m.id in ("relier.I001", "relier.E007")]


def test_kombus_own_redis_transport_is_pointed_at_relier_s(start_redis, relier, celery_conf):
    relier(REDIS_URL=start_redis().url)
    celery_conf.broker_transport = None  # the URL's scheme decides: kombu's redis
    info = by_id("relier.I001")
    assert 'CELERY_BROKER_TRANSPORT = "relier_django.transport:Transport"' in info.hint


def test_the_sentinel_transport_for_a_redis_url_is_an_error(start_redis, relier, celery_conf):
    relier(REDIS_URL=start_redis().url)
    celery_conf.broker_transport = "relier_django.transport:SentinelTransport"
    error = by_id("relier.E007")
    assert "for sentinel:// URLs" in error.msg
    assert error.hint == 'Set CELERY_BROKER_TRANSPORT = "relier_django.transport:Transport".'


def test_a_sentinel_url_wants_the_sentinel_transport(start_redis, relier, celery_conf, monkeypatch):
    relier(REDIS_URL=start_redis().url)
    url = "sentinel://127.0.0.1:1/0;sentinel://127.0.0.1:2/0"
    celery_conf.broker_url = url
    monkeypatch.setenv("CELERY_BROKER_URL", url)  # Celery reads it before its own setting
    celery_conf.broker_transport = "relier_django.transport:Transport"
    assert "SentinelTransport" in by_id("relier.E007").hint
    celery_conf.broker_transport = "sentinel"
    assert "SentinelTransport" in by_id("relier.I001").hint


def test_rabbitmq_without_publisher_confirms_or_with_a_delivery_limit_is_warned(
    start_redis, relier, celery_conf
):
    from kombu import Queue

    relier(REDIS_URL=start_redis().url)
    celery_conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"  # read, never connected to
    celery_conf.broker_transport = "pyamqp"
    celery_conf.broker_transport_options = {}
    assert ids() == ["relier.W008"]
    assert '{"confirm_publish": True}' in by_id("relier.W008").hint
    celery_conf.broker_transport_options = {"confirm_publish": True}
    assert ids() == []
    celery_conf.task_default_queue_type = "quorum"
    warning = by_id("relier.W009")
    assert "'celery'" in warning.msg and "QUEUED_GRACE_S" in warning.msg
    assert "'x-delivery-limit': -1" in warning.hint
    celery_conf.task_queues = [
        Queue("celery", queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": -1}),
        Queue("bulk", queue_arguments={"x-queue-type": "quorum"}),
    ]
    assert "'bulk'" in by_id("relier.W009").msg and "'celery'" not in by_id("relier.W009").msg


def test_a_spec_whose_soft_timeout_is_not_below_the_hard_one_is_an_error(
    start_redis, relier, register_task
):
    relier(REDIS_URL=start_redis().url)
    register_task(
        TaskSpec(name="checks.bad_timeouts", fn=_async_body, soft_timeout_s=5, hard_timeout_s=5)
    )
    error = by_id("relier.E006")
    assert "'checks.bad_timeouts'" in error.msg
    assert "soft_timeout=4, hard_timeout=5" in error.hint


def test_a_queue_no_worker_consumes_is_a_warning(start_redis, relier, register_task):
    url = start_redis().url
    relier(REDIS_URL=url)
    register_task(TaskSpec(name="checks.lonely", fn=_async_body, queue="reports"))
    warning = by_id("relier.W003")
    assert "'checks.lonely'" in warning.msg and "'reports'" in warning.msg
    assert "task_default_queue" in warning.msg
    assert "-Q reports" in warning.hint and "WORKER_QUEUES" in warning.hint
    # Declaring what the workers consume (their -Q) settles it.
    relier(REDIS_URL=url, WORKER_QUEUES=["celery", "reports"])
    assert ids() == []


def test_a_task_loaded_through_celery_imports_is_checked_too(start_redis, relier, celery_conf):
    module = "tests.integration.django_app.imported_only_tasks"
    relier(REDIS_URL=start_redis().url)
    celery_conf.imports = (module,)
    try:
        warning = by_id("relier.W003")
        assert "'checks.imported_invoice'" in warning.msg and "'invoices'" in warning.msg
    finally:
        current_app.tasks.unregister("checks.imported_invoice")
        sys.modules.pop(module, None)


def test_a_module_in_celery_imports_that_cannot_be_imported_is_an_error(
    start_redis, relier, celery_conf
):
    relier(REDIS_URL=start_redis().url)
    celery_conf.imports = ("billing.taskz",)
    error = by_id("relier.E013")
    assert "'billing.taskz'" in error.msg and "ModuleNotFoundError" in error.msg


def test_task_routes_are_followed_to_find_a_tasks_queue(
    start_redis, relier, register_task, celery_conf
):
    from kombu import Queue

    relier(REDIS_URL=start_redis().url)
    register_task(TaskSpec(name="checks.routed", fn=_async_body))
    celery_conf.task_routes = {"checks.*": {"queue": "slow"}}
    assert "'slow'" in by_id("relier.W003").msg
    celery_conf.task_queues = [Queue("celery"), Queue("slow")]
    assert ids() == []


# --- processes --------------------------------------------------------------------------


def manage_check(redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO_ROOT,
        env=worker_env(redis_url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_manage_py_check_exits_non_zero_on_a_server_without_aof(start_redis):
    bad = manage_check(start_redis("--appendonly", "no").url)
    assert bad.returncode != 0
    assert "relier.E003" in bad.stderr and "appendonly yes" in bad.stderr
    good = manage_check(start_redis().url)
    assert good.returncode == 0, good.stderr


def test_a_worker_refuses_to_start_while_relier_redis_is_unreachable(start_redis, tmp_path):
    broker = start_redis()
    port = free_port()
    worker = CeleryWorker(
        redis_url=broker.url,
        log_dir=tmp_path,
        name="unreachable",
        # Refused at the first attempt: the start check need not wait out the retry budget.
        extra_env={
            "RELIER_REDIS_URL": f"redis://:hunter2@127.0.0.1:{port}/0",
            **QUICK_REDIS_RETRY_ENV,
        },
    )
    try:
        worker.start(wait=False)
        assert worker.process is not None
        assert worker.process.wait(60) != 0
        log = worker.log_text()
        assert f"Redis at redis://:***@127.0.0.1:{port}/0 is unreachable" in log, log
        assert "refuses to start" in log and "hunter2" not in log
        assert "ready." not in log
    finally:
        worker.stop()
    # The same worker against a reachable Redis starts (the hook lets it through).
    healthy = CeleryWorker(redis_url=broker.url, log_dir=tmp_path, name="reachable")
    try:
        healthy.start(timeout_s=60)
    finally:
        healthy.stop()


def test_a_worker_refuses_to_start_on_settings_it_cannot_load(redis_server, redis_client, tmp_path):
    # G6 at the worker: a worker that cannot load its settings would take messages only
    # to fail each, leaving the tasks for QUEUED_GRACE_S. It exits instead, naming every
    # bad value in one line, and consumes nothing.
    from relier_django.core.store.keys import KeySpace
    from testproject.demo import tasks

    receipt = tasks.record.push("pushed-before-the-bad-worker")
    queued = redis_client.llen("celery")
    assert queued == 1
    worker = CeleryWorker(
        redis_url=redis_server.url,
        log_dir=tmp_path,
        name="misconfigured",
        extra_env={"RELIER_MAX_RETRIES": "lots", "RELIER_EMBEDDED_RESURRECTOR": "maybe"},
    )
    try:
        started = time.monotonic()
        worker.start(wait=False)
        assert worker.process is not None
        assert worker.process.wait(60) != 0
        assert time.monotonic() - started < 30
        log = worker.log_text()
        named = [
            line
            for line in log.splitlines()
            if "RELIER_MAX_RETRIES" in line and "RELIER_EMBEDDED_RESURRECTOR" in line
        ]
        assert len(named) == 1 and "refuses to start" in named[0], log
        assert "ready." not in log
    finally:
        worker.stop()
    assert redis_client.llen("celery") == queued  # the message is still in the broker
    assert redis_client.hget(KeySpace("rl").task(receipt.task_id), "state") == b"queued"


def test_a_redis_cluster_node_is_an_error_for_the_store_and_for_the_broker(
    tmp_path, start_redis, relier
):
    # Not start_redis(): a cluster node needs a port of at most 55535 (its bus is +10000).
    node = RedisServer(
        directory=tmp_path / "redis-cluster-node", port=free_cluster_port(),
        extra_args=("--cluster-enabled", "yes"),
    ).start()  # fmt: skip
    try:
        relier(REDIS_URL=node.url)
        error = by_id("relier.E014")
        assert error.is_serious() and "relier's settings" in error.msg
        assert "CROSSSLOT" in error.msg
        assert "RELIER['CLUSTER'] = True" in error.hint and "scaling.md" in error.hint
        relier(REDIS_URL=start_redis().url)
        current_app.conf.broker_url = node.url  # the fixture restores it
        error = by_id("relier.E014")
        assert "Celery's broker" in error.msg and "kombu" in error.msg
        assert "Sentinel" in error.hint and "RabbitMQ" in error.hint
    finally:
        node.stop()


def test_cluster_set_for_a_server_that_is_no_cluster_node_is_an_error(start_redis, relier):
    relier(REDIS_URL=start_redis().url, CLUSTER=True, PARTITIONS=6)
    error = by_id("relier.E016")
    assert error.is_serious() and "not a usable Redis Cluster node" in error.msg
    assert "unset CLUSTER" in error.hint


def test_a_refused_password_is_named_as_such_not_as_a_server_that_is_down(tmp_path, relier):
    server = RedisServer(directory=tmp_path / "redis-pw", password="s3cret").start()
    try:
        relier(REDIS_URL=server.url.replace("s3cret", "wrong-one"))
        warning = by_id("relier.W001")
    finally:
        server.stop()
    assert "refused relier's credentials" in warning.msg, warning.msg
    assert "wrong-one" not in warning.msg and "password" in warning.hint


def test_redis_broker_options_tuning_kombus_inverted_priorities_are_warned(
    start_redis, relier, celery_conf
):
    """relier.W011: kombu's Redis takes priority 0 first, relier 9 first (docs/priorities.md)."""
    relier(REDIS_URL=start_redis().url)
    celery_conf.broker_transport = "relier_django.transport:Transport"
    celery_conf.broker_transport_options = {"visibility_timeout": 3600}
    assert "relier.W011" not in ids()
    celery_conf.broker_transport_options = {"priority_steps": list(range(10))}
    warning = by_id("relier.W011")
    assert "priority_steps" in warning.msg and "9 - p" in warning.hint
    celery_conf.broker_transport_options = {"queue_order_strategy": "priority"}
    assert "'queue_order_strategy'" in by_id("relier.W011").hint
    celery_conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"  # read, never connected to
    celery_conf.broker_transport = "pyamqp"
    celery_conf.broker_transport_options = {"confirm_publish": True, "priority_steps": [0, 9]}
    assert "relier.W011" not in ids()  # RabbitMQ takes 9 first already


def test_a_resurrection_limit_for_an_unknown_cause_is_an_e001_naming_the_causes(relier):
    relier(RESURRECTIONS_BY_CAUSE={"oomkill": 0})
    errors = [m for m in relier_messages() if m.id == "relier.E001"]
    assert len(errors) == 1
    assert errors[0].msg.startswith(
        "settings.RELIER['RESURRECTIONS_BY_CAUSE']: 'oomkill' is not a cause of death"
    ), errors[0].msg
    assert "connection_closed" in errors[0].msg and "oom" in errors[0].msg
