"""The private PostgreSQL the on_commit tests rely on: it listens on a free port, never
the standard 5432, runs as an unprivileged user, accepts connections, is the "pg"
database of the test process and of its workers, and stop() leaves no process behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.db import connections

from testproject import postgres
from testproject.postgres import PostgresError, PostgresServer

STANDARD_PORT = 5432


def test_the_session_postgres_runs_unprivileged_on_a_port_of_its_own(postgres_server):
    assert postgres_server.port != STANDARD_PORT
    postmaster = psutil.Process(postgres_server.pid)
    with postgres_server.connect() as conn:
        assert conn.execute("SHOW port").fetchone() == (str(postgres_server.port),)
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        backend = psutil.Process(conn.info.backend_pid)
        assert backend.ppid() == postmaster.pid  # the backend serving us is its child
        for process in (postmaster, backend):
            assert 0 not in process.uids(), f"{process.name()} runs as root"
    assert Path(postmaster.cwd()) == postgres_server.data_dir.resolve()  # not Debian's cluster


@pytest.mark.skipif("pg" not in settings.DATABASES, reason="TESTPROJECT_POSTGRES_URL is empty")
def test_the_pg_database_and_the_workers_environment_name_the_private_server(postgres_server):
    db = connections["pg"].settings_dict
    assert (db["HOST"], db["PORT"], db["USER"]) == ("127.0.0.1", postgres_server.port, "postgres")
    assert os.environ["TESTPROJECT_POSTGRES_URL"] == postgres_server.url  # workers inherit it


def test_stop_ends_every_process_even_with_a_client_connected_and_removes_its_directory():
    with PostgresServer() as server:
        client = server.connect()
        postmaster = psutil.Process(server.pid)
        processes = [postmaster, *postmaster.children(recursive=True)]
        assert psutil.Process(client.info.backend_pid) in processes
        directory = server.directory
        assert directory is not None and (directory / "data" / "PG_VERSION").exists()
        stopping = time.monotonic()
    # Fast shutdown: the open client does not hold it up (SIGTERM's smart shutdown would).
    assert time.monotonic() - stopping < 5
    client.close()
    assert [p for p in processes if p.is_running()] == []
    assert not server.alive() and not directory.exists()
    server.stop()  # idempotent


def test_a_server_that_ignores_the_fast_shutdown_is_killed_with_its_backends():
    server = PostgresServer().start()
    client = server.connect()
    postmaster = psutil.Process(server.pid)
    processes = [postmaster, *postmaster.children(recursive=True)]
    os.kill(server.pid, signal.SIGSTOP)  # a hung postmaster: SIGINT is never acted on
    server.stop(timeout_s=1)
    client.close()
    gone, alive = psutil.wait_procs(processes, timeout=10)  # orphaned backends: init reaps
    assert alive == [] and len(gone) == len(processes) > 1
    assert server.directory is None


def test_missing_server_binaries_fail_naming_the_package_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(postgres, "DEBIAN_ROOT", tmp_path / "no-postgresql")
    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_config, no initdb
    with pytest.raises(PostgresError, match=r"Debian's `postgresql` package \(`make setup`"):
        PostgresServer().start()
