"""A private RabbitMQ node, started and stopped by PID, for the broker tests of issue #28.

Like the Redis servers in ``harness.py``, it never touches a server it did not start.
A machine with Debian's ``rabbitmq-server`` installed usually runs its own node
(``rabbit@<host>`` on 5672, distribution on 25672) and an ``epmd`` on 4369; this node
shares none of that:

- its own name (``relier-<port>@localhost``), AMQP port, distribution port and a
  private ``epmd`` on a port of its own (``ERL_EPMD_PORT``), all free ports of
  127.0.0.1. We start that ``epmd`` ourselves, in the foreground, so its PID is ours to
  stop; ``-start_epmd false`` (in ``ERL_FLAGS``, which every Erlang VM started with this
  environment reads) keeps the node and ``rabbitmqctl`` from daemonizing an ``epmd`` of
  their own, which would outlive them;
- its own data, logs, config, ``enabled_plugins`` (none: no management plugin) and
  Erlang cookie (``$HOME/.erlang.cookie`` with ``HOME`` in its directory), and an
  environment built from scratch. Without ``RABBITMQ_CONF_ENV_FILE``,
  ``RABBITMQ_CONFIG_FILE(S)`` and ``RABBITMQ_ADVANCED_CONFIG_FILE`` of our own, the
  files in ``/etc/rabbitmq`` would apply: Debian's ``rabbitmq-env.conf`` names the node
  ``rabbit@localhost`` and ``rabbitmq.conf`` may pin the listener to 5672. RabbitMQ
  also reads each variable without its ``RABBITMQ_`` prefix (``NODENAME``,
  ``NODE_PORT``...), so nothing is inherited from the caller's environment.

It runs ``/usr/lib/rabbitmq/bin/rabbitmq-server``, not Debian's wrapper
``/usr/sbin/rabbitmq-server``: run as root, the wrapper switches to the ``rabbitmq``
user with ``su`` (whose HOME holds the machine's node cookie), works in
``/var/lib/rabbitmq`` and writes ``/var/log/rabbitmq/startup_log``. The real script runs
as whoever starts it. With ``RABBITMQ_ALLOW_INPUT`` set it ``exec``s the Erlang VM
instead of waiting on it in a shell, so the PID we hold is ``beam.smp``'s own;
``-noinput`` keeps the VM from reading the (empty) stdin all the same.

Start-up is mostly code loading: before it runs its boot steps, RabbitMQ loads every
module of every loaded application to read their attributes, each one looked up along
the whole code path, and Debian's package puts all of its ~80 plugins on that path
(``ERL_LIBS=$RABBITMQ_HOME/plugins``) and reads the config schema of each. So the node
runs from a home of its own, ``runtime/``: ``plugins/`` links to the 20 applications
``rabbit`` needs (the closure of its ``.app`` dependencies), ``sbin/`` and ``escript/``
to the package's. ``RABBITMQ_SCRIPTS_DIR``, which ``rabbitmq-env`` honours, points
there, and ``RABBITMQ_HOME`` follows from it. That halves start-up: 7.5 s to 3.5 s on
a two-core machine, measured.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar, Self

import psutil
from kombu.connection import Connection
from kombu.exceptions import OperationalError

from testproject.servers import PrivateServer, free_port, poll

logger = logging.getLogger(__name__)

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
# The Erlang VM Debian's package depends on, whatever `erl` comes first on a developer's
# PATH: each RabbitMQ release supports a narrow range of Erlang releases.
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
NAME_PREFIX = "relier"
USER = PASSWORD = "guest"  # RabbitMQ's default user, refused from anywhere but loopback


class RabbitError(RuntimeError):
    """The private RabbitMQ could not be set up, exited before it was ready, or a
    ``rabbitmqctl`` command against it failed."""


def _free_port_besides(taken: set[int]) -> int:
    while (port := free_port()) in taken:
        pass
    taken.add(port)
    return port


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def _gone(process: psutil.Process) -> bool:
    # An orphan stays a zombie until init reaps it; it runs nothing and holds no port.
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _kill(processes: Iterable[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def _tail(path: Path, chars: int = 3000, offset: int = 0) -> str:
    """The end of ``path`` past ``offset``; from RabbitMQ's "BOOT FAILED" report on, if
    there is one: the error is at its head, the shutdown that follows it is noise."""
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    report = text.rfind("BOOT FAILED")
    return text[report : report + chars] if report >= 0 else text[-chars:]


# `{applications, [...]}` and `{included_applications, [...]}` in an `.app` file.
_APP_DEPENDENCIES = re.compile(r"\{(?:included_)?applications,\s*\[([^\]]*)\]")


def required_apps(plugins: Path, root: str = "rabbit") -> list[Path]:
    """The directories in ``plugins`` of ``root`` and of every application it needs,
    transitively (Erlang/OTP's own applications live elsewhere, and are skipped).

    Raises:
        RabbitError: ``root`` is not in ``plugins``.
    """
    by_name = {d.name.rsplit("-", 1)[0]: d for d in plugins.iterdir() if (d / "ebin").is_dir()}
    if root not in by_name:
        raise RabbitError(f"no {root}-<version> application in {plugins}")
    found: dict[str, Path] = {}
    pending = [root]
    while pending:
        name = pending.pop()
        if name in found or name not in by_name:
            continue
        found[name] = by_name[name]
        spec = (by_name[name] / "ebin" / f"{name}.app").read_text()
        for names in _APP_DEPENDENCIES.findall(spec):
            pending.extend(n.strip().strip("'") for n in names.split(",") if n.strip())
    return sorted(found.values())


def make_runtime_home(server: Path, home: Path) -> Path:
    """Fill ``home`` with links to the package's ``sbin`` and ``escript`` and to the
    applications ``rabbit`` needs, under ``plugins``; return ``home``. Idempotent."""
    release = server.resolve().parent.parent  # .../lib/rabbitmq_server-<version>
    (home / "plugins").mkdir(parents=True, exist_ok=True)
    links = {home / "sbin": release / "sbin", home / "escript": release / "escript"}
    links.update({home / "plugins" / app.name: app for app in required_apps(release / "plugins")})
    for link, target in links.items():
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=True)
    return home


def find_executables() -> tuple[Path, Path, Path]:
    """``rabbitmq-server`` and ``rabbitmqctl`` (the real scripts, not Debian's wrappers)
    and ``epmd``.

    Raises:
        RabbitError: one is missing; the message names the package to install.
    """
    server, ctl = RABBITMQ_BIN / "rabbitmq-server", RABBITMQ_BIN / "rabbitmqctl"
    epmd = shutil.which("epmd", path=SYSTEM_PATH)
    if not (os.access(server, os.X_OK) and os.access(ctl, os.X_OK)) or epmd is None:
        raise RabbitError(
            f"RabbitMQ is not installed: no {server}, {ctl} or epmd on {SYSTEM_PATH}. "
            "Install Debian's `rabbitmq-server` package (apt-get install rabbitmq-server; "
            "`make setup` does: ./scripts/bootstrap.sh)"
        )
    return server, ctl, Path(epmd)


@dataclass
class RabbitServer(PrivateServer):
    """A private RabbitMQ node (no plugins, user ``guest``) in ``directory``.

    Ports left at 0 are picked free at construction and kept for the server's life, so
    ``restart()`` brings the node back under the same name, on the same data. The
    directory is kept after ``stop()``, as ``RedisServer`` keeps its own.

    Use it as a context manager (``with RabbitServer(path) as rabbit:``) or call
    ``start()`` and ``stop()``.
    """

    program: ClassVar[str] = "RabbitMQ node"
    error: ClassVar[type[Exception]] = RabbitError
    log_name: ClassVar[str] = "console.log"  # stdout and stderr: early boot errors land here

    directory: Path
    port: int = 0
    dist_port: int = 0
    epmd_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    epmd: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)  # where this start's output begins

    def __post_init__(self) -> None:
        taken = {self.port, self.dist_port, self.epmd_port} - {0}
        self.port = self.port or _free_port_besides(taken)
        self.dist_port = self.dist_port or _free_port_besides(taken)
        self.epmd_port = self.epmd_port or _free_port_besides(taken)

    @property
    def node(self) -> str:
        """The Erlang node name, ``relier-<port>@localhost``: the data lives under it."""
        return f"{NAME_PREFIX}-{self.port}@localhost"

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>//`` (the default vhost)."""
        return f"amqp://{USER}:{PASSWORD}@127.0.0.1:{self.port}//"

    @property
    def epmd_pid(self) -> int:
        if self.epmd is None:
            raise RabbitError("the node's epmd was never started")
        return self.epmd.pid

    @property
    def node_log_path(self) -> Path:
        return self.directory / "log" / f"{self.node}.log"

    def log_tail(self, chars: int = 3000) -> str:
        # This start's output only (the log is kept across restarts), from RabbitMQ's
        # "BOOT FAILED" report on; then where the node's own log is.
        tail = _tail(self.log_path, chars, offset=self._log_offset)
        return f"{tail}\n(the node {self.node}'s own log: {self.node_log_path})"

    def start(self, timeout_s: float = 60) -> Self:
        """Start ``epmd`` (unless it still runs) and the node; return once an AMQP
        connection as ``guest`` succeeds.

        Raises:
            RabbitError: RabbitMQ is not installed, or ``epmd`` or the node exited before
                it was ready (the message carries their output's tail).
            TimeoutError: the node took longer than ``timeout_s`` seconds.
        """
        server, _, epmd = find_executables()
        self._prepare_directory(server)
        self._log_offset = self._open_log().tell()
        try:
            self._start_epmd(epmd)
            self.process = subprocess.Popen(
                [str(server)],
                cwd=self.directory,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,  # a file, not a pipe: the VM blocks on a full or closed pipe
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for pytest does not reach it
            )
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_directory(self, server: Path) -> None:
        home = self.directory / "home"
        for path in (home, self.directory / "conf.d", self.directory / "mnesia"):
            path.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():  # kept across restarts: rabbitmqctl must keep matching it
            # Owner-only from the start: Erlang refuses a cookie file others can read.
            fd = os.open(cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16))
        for name in ("rabbitmq-env.conf", "rabbitmq.conf"):
            (self.directory / name).write_text(f"# Empty: stands in for /etc/rabbitmq/{name}\n")
        (self.directory / "enabled_plugins").write_text("[].\n")
        make_runtime_home(server, self.directory / "runtime")

    def _env(self) -> dict[str, str]:
        d = self.directory
        return {
            "PATH": SYSTEM_PATH,
            "HOME": str(d / "home"),  # where the VM and rabbitmqctl read the cookie
            "LANG": "C.UTF-8",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_FLAGS": "-start_epmd false",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            # The default is the AMQP port + 20000, past 65535 for most free ports.
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_CONFIG_FILES": str(d / "conf.d" / "*.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_SCRIPTS_DIR": str(d / "runtime" / "sbin"),  # see the module docstring
            "RABBITMQ_PLUGINS_DIR": str(d / "runtime" / "plugins"),
            "RABBITMQ_ALLOW_INPUT": "true",  # exec the VM: see the module docstring
            # +B i: SIGINT does not halt the VM (the wrapping shell's default, kept).
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-noinput +B i -kernel inet_dist_use_interface {127,0,0,1}"
            ),
            # rabbitmqctl's own distribution listener: any free port rather than Debian's
            # fixed 35672-35682, which the machine's rabbitmqctl uses too.
            "RABBITMQ_CTL_DIST_PORT_MIN": "0",
            "RABBITMQ_CTL_DIST_PORT_MAX": "0",
        }

    def _start_epmd(self, epmd: Path) -> None:
        if self.epmd is not None and self.epmd.poll() is None:
            return  # it outlives kill(), as a machine's epmd outlives a crashed node
        self.epmd = subprocess.Popen(
            [str(epmd), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            cwd=self.directory,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        poll(self._epmd_listening, 10, f"epmd on port {self.epmd_port}")

    def _epmd_listening(self) -> bool | None:
        # Our epmd's own socket, not merely "something answers": another epmd may hold it.
        assert self.epmd is not None
        if self.epmd.poll() is not None:
            raise RabbitError(
                f"epmd exited with {self.epmd.returncode} (port {self.epmd_port} taken?):\n"
                + _tail(self.log_path, offset=self._log_offset)
            )
        for conn in psutil.Process(self.epmd.pid).net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == self.epmd_port:
                return True
        return None

    def _answers(self) -> bool:
        # max_retries=0: connect() would sleep 2 s after a refused connection.
        connection = Connection(self.url, connect_timeout=2)
        try:
            connection.ensure_connection(max_retries=0)
        except OperationalError:
            return False  # not listening yet, or still booting
        finally:
            connection.release()
        return True

    def ctl(self, *args: str, timeout_s: float = 60) -> str:
        """Run ``rabbitmqctl -n <node> *args`` against this node and return its stdout,
        e.g. ``ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")``.

        Raises:
            RabbitError: it exited with a non-zero status (the message carries its output).
            subprocess.TimeoutExpired: it took longer than ``timeout_s`` seconds.
        """
        _, ctl, _ = find_executables()
        result = subprocess.run(
            [str(ctl), "-n", self.node, *args],
            cwd=self.directory, env=self._env(), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        if result.returncode != 0:
            raise RabbitError(
                f"rabbitmqctl {' '.join(args)} exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result.stdout

    def processes(self) -> list[psutil.Process]:
        """The node's VM and every process it runs (``erl_child_setup``, port programs
        such as ``inet_gethost``), then our ``epmd``: all this server may leave behind."""
        found = []
        for popen in (self.process, self.epmd):
            if popen is not None and popen.poll() is None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    found.append(psutil.Process(popen.pid))
                    if popen is self.process:
                        found.extend(_descendants(popen.pid))
        return found

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the node with ``rabbitmqctl stop``; past ``timeout_s`` seconds, SIGTERM
        (the VM's own clean halt), then SIGKILL it and everything it spawned. Then stop
        our ``epmd``. Idempotent."""
        self._stop_node(timeout_s)
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.terminate()
            try:
                self.epmd.wait(5)
            except subprocess.TimeoutExpired:
                self.epmd.kill()
                self.epmd.wait(5)
        self._release()  # the directory stays: it is the caller's (restart() reuses it)

    def _stop_node(self, timeout_s: float) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        # erl_child_setup and the port programs run in sessions of their own
        # (setsid), so no process-group signal reaches them: list them while we can.
        spawned = _descendants(process.pid)
        deadline = time.monotonic() + timeout_s
        try:
            self.ctl("stop", timeout_s=timeout_s)
            process.wait(max(0.1, deadline - time.monotonic()))
        except (RabbitError, subprocess.TimeoutExpired) as exc:
            logger.warning("RabbitMQ node %s did not stop cleanly (%s); SIGTERM", self.node, exc)
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._reap(spawned)

    def kill(self) -> None:
        """SIGKILL the node's VM and every process it spawned at once, as a crash would.
        Our ``epmd`` stays up, as a machine's does when a node crashes: ``start()``
        (or ``stop()``) follows."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        spawned = _descendants(process.pid)
        process.kill()
        _kill(spawned)
        process.wait(10)
        self._reap(spawned)

    @staticmethod
    def _reap(spawned: list[psutil.Process]) -> None:
        # They exit on their own once the VM's end of their pipes closes; SIGKILL any
        # that lingers (a port program that ignores EOF).
        deadline = time.monotonic() + 5
        while not all(_gone(p) for p in spawned) and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill(p for p in spawned if not _gone(p))

    def restart(self, timeout_s: float = 60) -> Self:
        """``rabbitmqctl stop``, then start again under the same name, on the same ports
        and data: what durable queues held persistently is still there."""
        self._stop_node(timeout_s)
        return self.start(timeout_s)
