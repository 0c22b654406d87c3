"""``manage.py relier_resurrector``: the resurrector as a standalone process."""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

import redis
from celery import current_app
from django.core.management.base import BaseCommand, CommandError

from relier_django import conf
from relier_django.core.model.config import Config
from relier_django.core.recovery.scanner import Scanner
from relier_django.core.store.connection import describe, sync_client


class Command(BaseCommand):
    help = (
        "Bring back tasks whose worker died: scan the expiry index and re-dispatch them "
        "(one scanner leads at a time; workers run one too, embedded)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="run one pass and exit")
        parser.add_argument(
            "--interval", type=float, default=None,
            help="seconds between passes (default: the SCAN_INTERVAL_S setting)",
        )  # fmt: skip

    def handle(self, *args: Any, once: bool, interval: float | None, **options: Any) -> None:
        if interval is not None and interval <= 0:
            raise CommandError("--interval must be > 0")
        cfg = conf.get_config()
        _credentials_accepted(cfg)
        scanner = Scanner(current_app, cfg, f"{socket.gethostname()}:{os.getpid()}:command")
        if once:
            try:
                report = scanner.tick()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                # One pass was asked for: an outage is the answer, not something to wait out.
                raise CommandError(f"cannot reach Redis at {conf.redis_location()}: {exc}") from exc
            if report is None:
                self.stdout.write("Another scanner holds the leader lease; nothing done.")
                scanner.release()
                return
            scanner.release()
            self.stdout.write(
                f"expired={report.expired} deferred={report.deferred} "
                + " ".join(f"{k}={v}" for k, v in sorted(report.outcomes.items()))
                + f" ({report.seconds * 1000:.1f} ms)"
            )
            return

        def stop(signum: int, _frame: Any) -> None:
            self.stdout.write(f"Received {signal.Signals(signum).name}; finishing the pass.")
            scanner.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(
            f"Resurrector {scanner.scanner_id} on {describe(cfg)} scanning every "
            f"{interval or cfg.scan_interval_s:g}s (Ctrl-C to stop)."
        )
        scanner.run(interval_s=interval)
        self.stdout.write("Resurrector stopped.")


def _credentials_accepted(cfg: Config) -> None:
    """Exit at once when Redis refuses relier's credentials: that will not change while
    the command waits (an unreachable Redis may come back, and is waited for).

    Raises:
        CommandError: the password or user was refused; the message names the server
            without the password.
    """
    try:
        sync_client(cfg, fail_fast=True).ping()
    except redis.exceptions.AuthenticationError as exc:
        raise CommandError(
            f"Redis at {describe(cfg)} refused relier's credentials ({exc}): correct the "
            "user or password in RELIER['REDIS_URL'] (or RELIER_REDIS_URL)."
        ) from None
    except redis.exceptions.RedisError:
        pass  # away for now: the scanner waits for it, as it does for an outage
