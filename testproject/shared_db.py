"""A database that a test and the workers it starts share: migrated, empty, dropped
after the test. SQLite (a file) or a database of the session's private PostgreSQL.

pytest-django's test databases do not fit here: its SQLite one lives in memory, and its
transactional tests flush between tests while workers still hold connections. The
workers get the URL as ``DATABASE_URL`` (the testproject's default database).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .postgres import PostgresServer

ROOT = Path(__file__).resolve().parent.parent
# SQLite: a writer waits up to 30 s for the write lock. Transactions stay DEFERRED
# (Django's default): the lock is taken at the first write, so an incarnation paused
# before writing (a zombie test's window) holds nothing the others need.
SQLITE_OPTIONS = "timeout=30"


@dataclass
class SharedDatabase:
    """``url`` for ``DATABASE_URL``; ``query`` reads it directly (no Django alias)."""

    kind: str  # "sqlite" or "pg"
    url: str
    path: Path | None = None  # SQLite's file
    server: PostgresServer | None = None
    name: str = ""  # PostgreSQL's database name

    @classmethod
    def create(cls, kind: str, directory: Path, server: PostgresServer | None) -> SharedDatabase:
        if kind == "sqlite":
            path = directory / f"shared-{uuid.uuid4().hex[:8]}.sqlite3"
            db = cls(kind, f"sqlite:///{path}?{SQLITE_OPTIONS}", path=path)
        elif kind == "pg":
            if server is None:
                raise ValueError("a PostgreSQL shared database needs the session's server")
            name = f"shared_{uuid.uuid4().hex[:12]}"
            with server.connect(autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            login = server.url.rsplit("/", 1)[0]
            db = cls(kind, f"{login}/{name}", server=server, name=name)
        else:
            raise ValueError(f"unknown database kind {kind!r}")
        db.migrate()
        return db

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a process (a worker, a producer) needs to use it."""
        return {"DATABASE_URL": self.url, **extra}

    def migrate(self) -> None:
        env = {**os.environ, **self.env(), "DJANGO_SETTINGS_MODULE": "testproject.settings"}
        done = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed on {self.kind}:\n{done.stdout}\n{done.stderr}")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (``%s`` placeholders, as in Django), on a fresh connection."""
        if self.path is not None:
            with sqlite3.connect(self.path, timeout=30) as conn:
                return list(conn.execute(sql.replace("%s", "?"), params))
        assert self.server is not None
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.server.port, user="postgres", dbname=self.name,
            connect_timeout=5, autocommit=True,
        ) as conn:  # fmt: skip
            return list(conn.execute(sql, params).fetchall())

    def drop(self) -> None:
        if self.path is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            return
        assert self.server is not None
        if self.server.alive():
            with self.server.connect(autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
