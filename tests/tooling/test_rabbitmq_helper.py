"""The private RabbitMQ node the broker tests of issue #28 run on (testproject/rabbitmq.py):
it carries messages for kombu, listens on loopback ports of its own with an epmd of its
own (never 5672, 4369 or 25672: never the machine's node or epmd), keeps persistent
messages across a restart and a crash, and stop() leaves no process of ours behind.
"""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest
from kombu.connection import Connection

from testproject import rabbitmq
from testproject.rabbitmq import RabbitError, RabbitServer, find_executables

# What Debian's own node and epmd use: AMQP, epmd, Erlang distribution.
STANDARD_PORTS = {5672, 4369, 25672}
EPMD_PORT = 4369


def _listeners(port: int) -> set[int | None]:
    """The PIDs listening on ``port`` (None for a socket whose owner this user may not
    see), read from /proc: nothing connects to the port."""
    return {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def _gone(process: psutil.Process) -> bool:
    # An orphan is a zombie until init reaps it: it runs nothing and holds no port.
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _publish_confirmed(url: str, queue: str, body: object) -> None:
    # A SimpleQueue's queue and exchange are durable and its messages persistent; with
    # publisher confirms put() returns once the node has the message on disk.
    confirmed = Connection(url, transport_options={"confirm_publish": True})
    with confirmed as conn, conn.SimpleQueue(queue) as simple:
        simple.put(body)


def _consume(url: str, queue: str) -> object:
    with Connection(url) as conn, conn.SimpleQueue(queue) as simple:
        message = simple.get(timeout=10)
        message.ack()
        return message.payload


def _messages(server: RabbitServer, queue: str) -> str:
    table = server.ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")
    counts = dict(line.split("\t", 1) for line in table.splitlines())
    return counts.get(queue, "absent")


def test_a_message_published_through_kombu_is_consumed_from_the_private_node(
    rabbit_server: RabbitServer,
) -> None:
    queue = f"helper-{uuid.uuid4().hex}"
    _publish_confirmed(rabbit_server.url, queue, {"hello": "rabbit"})
    assert _messages(rabbit_server, queue) == "1"
    assert _consume(rabbit_server.url, queue) == {"hello": "rabbit"}
    assert _messages(rabbit_server, queue) == "0"


def test_the_node_and_its_epmd_listen_on_loopback_ports_of_their_own(
    rabbit_server: RabbitServer,
) -> None:
    server = rabbit_server
    ports = {server.port, server.dist_port, server.epmd_port}
    assert len(ports) == 3 and not ports & STANDARD_PORTS
    vm = psutil.Process(server.pid)
    assert vm.name() == "beam.smp"  # the PID we hold is the VM's, not a wrapping shell's
    sockets = vm.net_connections("tcp")
    listening = {c.laddr for c in sockets if c.status == psutil.CONN_LISTEN}
    assert {(a.ip, a.port) for a in listening} == {
        ("127.0.0.1", server.port),
        ("127.0.0.1", server.dist_port),
    }
    peers = {c.raddr.port for c in sockets if c.raddr}
    assert server.epmd_port in peers and not peers & STANDARD_PORTS
    # The epmd it registered with is the one this process started, not a daemon.
    epmd = psutil.Process(server.epmd_pid)
    assert epmd.ppid() == os.getpid() and _listeners(server.epmd_port) == {epmd.pid}
    names = subprocess.run(
        [str(find_executables()[2]), "-port", str(server.epmd_port), "-names"],
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout  # fmt: skip
    assert f"name {server.node.split('@')[0]} at port {server.dist_port}" in names


def test_a_persistent_message_survives_a_restart_and_a_crash(tmp_path: Path) -> None:
    queue = "durable"
    with RabbitServer(tmp_path) as server:
        _publish_confirmed(server.url, queue, {"n": 1})
        first_vm = server.pid
        server.restart()
        assert server.pid != first_vm and _messages(server, queue) == "1"

        spawned = psutil.Process(server.pid).children(recursive=True)
        epmd = server.epmd_pid
        server.kill()
        assert not server.alive()
        assert [p for p in spawned if not _gone(p)] == []  # all at once, as in a crash
        assert psutil.pid_exists(epmd)  # a machine's epmd outlives a crashed node
        server.start()
        assert server.epmd_pid == epmd
        assert _consume(server.url, queue) == {"n": 1}


def test_stop_leaves_no_process_of_ours_and_the_machines_epmd_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=rabbitmq.__name__)
    system_epmd = _listeners(EPMD_PORT)
    server = RabbitServer(tmp_path).start()
    ours = server.processes()
    assert {"beam.smp", "erl_child_setup", "epmd"} <= {p.name() for p in ours}
    server.stop()
    assert [p for p in ours if not _gone(p)] == []
    assert not caplog.records  # `rabbitmqctl stop` did it: no SIGTERM fallback
    for port in (server.port, server.dist_port, server.epmd_port):
        assert _listeners(port) == set()  # no epmd daemonized on our port either
    assert _listeners(EPMD_PORT) == system_epmd
    server.stop()  # idempotent


def test_a_missing_rabbitmq_fails_naming_the_package_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rabbitmq, "RABBITMQ_BIN", tmp_path / "no-rabbitmq")
    with pytest.raises(RabbitError, match=r"Debian's `rabbitmq-server` package"):
        RabbitServer(tmp_path).start()
