"""A private PostgreSQL server, started and stopped by PID, for the on-commit tests.

Like the Redis servers in ``harness.py``, it never touches a server it did not start:
``initdb`` makes a new cluster in a temp directory of its own, ``postgres`` listens on
a free port of 127.0.0.1 with its Unix socket in that directory too, and only its own
PIDs are ever signalled. A system PostgreSQL on 5432 (Debian's service, say) is left
alone and never connected to.

PostgreSQL refuses to run as root, so when this process is root the cluster belongs to
an unprivileged system user, ``relier-pg``, created on first use; ``initdb`` and
``postgres`` are started as that user (``Popen(user=...)``, so the PID we hold is the
server's own).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Self

import psutil
import psycopg

from testproject.servers import PrivateServer, free_port

SYSTEM_USER = "relier-pg"
SUPERUSER = "postgres"  # the cluster's superuser role (initdb -U), not an OS account
DEBIAN_ROOT = Path("/usr/lib/postgresql")
BINARIES = ("initdb", "postgres")


class PostgresError(RuntimeError):
    """The private PostgreSQL could not be set up, or exited before it was ready."""


@dataclass(frozen=True)
class Account:
    """The OS user the cluster runs as: its name, uid and primary gid."""

    name: str
    uid: int
    gid: int


def find_bindir() -> Path:
    """The directory holding PostgreSQL's ``initdb`` and ``postgres``: Debian's newest
    ``/usr/lib/postgresql/<major>/bin``, else ``pg_config --bindir``, else ``PATH``.

    Raises:
        PostgresError: none of them has both binaries; the message names the package.
    """
    candidates = sorted((int(d.name), d / "bin") for d in DEBIAN_ROOT.glob("*") if d.name.isdigit())
    found = [bindir for _, bindir in reversed(candidates)]
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        result = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if result.returncode == 0 and result.stdout.strip():
            found.append(Path(result.stdout.strip()))
    on_path = shutil.which("initdb")
    if on_path is not None:
        found.append(Path(on_path).resolve().parent)
    for bindir in found:
        if all(os.access(bindir / name, os.X_OK) for name in BINARIES):
            return bindir
    raise PostgresError(
        "PostgreSQL's server binaries (initdb, postgres) are not installed: none in "
        f"{DEBIAN_ROOT}/<major>/bin, in `pg_config --bindir` or on PATH. Install Debian's "
        "`postgresql` package (`make setup` does: ./scripts/bootstrap.sh)"
    )


def server_account(name: str = SYSTEM_USER) -> Account | None:
    """The unprivileged user to run the cluster as when this process is root (created
    with ``useradd --system`` if missing), None when it is not root (the cluster is
    then this user's own).

    Raises:
        PostgresError: the user is missing and ``useradd`` failed.
    """
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        result = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--user-group",
             "--shell", "/usr/sbin/nologin", name],
            capture_output=True, text=True,
        )  # fmt: skip
        try:  # a concurrent session may have created it first: its useradd failed then
            entry = pwd.getpwnam(name)
        except KeyError:
            raise PostgresError(
                f"PostgreSQL refuses to run as root and the system user {name!r} could not "
                f"be created ({result.stderr.strip() or result.returncode}): create it "
                f"(useradd --system --no-create-home {name}) or run the tests as non-root"
            ) from None
    return Account(name, entry.pw_uid, entry.pw_gid)


def _traversable(path: Path, account: Account) -> bool:
    """Whether ``account`` (without supplementary groups) can reach into ``path``."""
    for part in (path, *path.parents):
        st = part.stat()
        if st.st_uid == account.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == account.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


@dataclass
class PostgresServer(PrivateServer):
    """A private ``postgres``: a new cluster (trust auth, superuser ``postgres``, UTF8,
    C locale) on a free port of 127.0.0.1, fsync off.

    Without ``directory`` it makes a temporary one (under ``TMPDIR`` when the cluster's
    user can reach it, else under ``/tmp``) and removes it on ``stop()``; a given
    directory is kept, and must be reachable by that user.

    Use it as a context manager (``with PostgresServer() as pg:``) or call ``start()``
    and ``stop()``. ``url`` names its ``postgres`` database; pytest-django creates and
    drops ``test_postgres`` beside it.
    """

    program: ClassVar[str] = "postgres"
    error: ClassVar[type[Exception]] = PostgresError
    log_name: ClassVar[str] = "postgres.log"

    directory: Path | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    account: Account | None = field(default=None, repr=False)
    _own_directory: bool = field(default=False, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``postgres://postgres@127.0.0.1:<port>/postgres`` (no password: trust auth)."""
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    @property
    def data_dir(self) -> Path:
        if self.directory is None:
            raise PostgresError("postgres has no directory before start()")
        return self.directory / "data"

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A new psycopg connection to this server's ``postgres`` database, over TCP."""
        kwargs.setdefault("connect_timeout", 5)
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", **kwargs
        )

    def start(self, timeout_s: float = 60) -> Self:
        """Make the cluster, start the server, and return once it accepts connections.

        Raises:
            PostgresError: the binaries are missing, ``initdb`` failed, or ``postgres``
                exited before it was ready (the message carries its log's tail).
            TimeoutError: it was not ready within ``timeout_s`` seconds.
        """
        bindir = find_bindir()
        self.account = server_account()
        self._make_directory()
        try:
            self._initdb(bindir)
            self.process = subprocess.Popen(
                self._server_args(bindir),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=self._open_log(),
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for pytest is not a fast shutdown
                **self._as_account(),
            )
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _as_account(self) -> dict[str, Any]:
        # Popen's setuid happens in the child, before exec: the PID is the server's.
        if self.account is None:
            return {}
        return {"user": self.account.uid, "group": self.account.gid, "extra_groups": []}

    def _make_directory(self) -> None:
        if self.directory is None:
            base = Path(tempfile.gettempdir())
            if self.account is not None and not _traversable(base, self.account):
                base = Path("/tmp")  # e.g. a CI's TMPDIR made by `mktemp -d`, mode 0700
            self._make_temp_directory(base)
        (self.directory / "socket").mkdir(parents=True, exist_ok=True)
        if self.account is not None:
            for path in (self.directory, self.directory / "socket"):
                os.chown(path, self.account.uid, self.account.gid)

    def _initdb(self, bindir: Path) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return  # a given directory that already holds a cluster: start it as it is
        args = [
            str(bindir / "initdb"), "-D", str(self.data_dir),
            "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--no-locale",
            "--no-sync",  # a throw-away cluster: nothing to make durable
        ]  # fmt: skip
        result = subprocess.run(
            args, cwd=self.directory, capture_output=True, text=True, timeout=300,
            **self._as_account(),
        )  # fmt: skip
        if result.returncode != 0:
            raise PostgresError(
                f"initdb exited with {result.returncode}:\n{result.stdout}{result.stderr}"
            )

    def _server_args(self, bindir: Path) -> list[str]:
        assert self.directory is not None
        return [
            str(bindir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            # The socket and its lock file in our directory, not Debian's
            # /var/run/postgresql, where the system cluster keeps its own.
            "-k", str(self.directory / "socket"),
            "-c", "listen_addresses=127.0.0.1",
            # The cluster is thrown away at the end of the session, so a crash may lose
            # it whole; without fsync a commit costs no disk flush on a busy CI disk.
            "-c", "fsync=off",
        ]  # fmt: skip

    def _answers(self) -> bool:
        try:
            self.connect(connect_timeout=2).close()
        except psycopg.OperationalError:
            return False  # not listening yet, or "the database system is starting up"
        return True

    def stop(self, timeout_s: float = 10) -> None:
        """Fast shutdown (SIGINT), then SIGKILL to it and its children if it lingers past
        ``timeout_s``; reap it, close its log, and remove its directory if ``start()``
        made it. Idempotent.

        SIGINT, not SIGTERM: SIGTERM is PostgreSQL's "smart" shutdown, which waits for
        every client to disconnect, and the test process keeps its Django connections
        until it exits. SIGINT ends their sessions and shuts down cleanly.
        """
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill(process)
        self._release()

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        # Each backend is a session leader of its own (PostgreSQL calls setsid() in
        # every child), so a process-group kill would miss them: list them first.
        try:
            children = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        process.kill()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        process.wait(10)
        psutil.wait_procs(children, timeout=10)
