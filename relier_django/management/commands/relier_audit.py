"""``manage.py relier_audit``: the delivery ledger reconciled with the store.

Every task pushed since ``--since`` (the outbox relay's and periodic ticks' included,
and a workflow's steps) is explained as committed, dead-lettered (with its reason),
cancelled, or in flight within its bound; what is left is
printed as ``unexplained: 0`` or the ids. ``--json`` prints one object for a cron job
and an alert; ``--check`` exits 1 when any id is unexplained (docs/commands.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from relier_django import conf
from relier_django.core.observe.audit import CLASSES, Audit, audit, now
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.readers.render import utc_text

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> float:
    """``90s``, ``15m``, ``24h``, ``2d`` or a number of seconds, as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise CommandError(f"--since {text!r}: give a duration such as 90s, 15m, 24h or 2d")
    return float(match[1]) * _UNITS[match[2] or "s"]


def render(found: Audit) -> list[str]:
    """The text form, one line per item (a test reads it)."""
    if not found.horizon_ms:
        return ["the delivery ledger is off (AUDIT_HORIZON_S = 0): nothing to audit"]
    lines = [
        f"relier audit at {utc_text(found.at_ms)} (Redis clock), tasks pushed since "
        f"{utc_text(found.since_ms)}: {found.noted}",
    ]
    for name in CLASSES:
        lines.append(f"  {name.replace('_', ' ')}: {found.classes.get(name, 0)}")
        detail = {"dead_lettered": found.dead_lettered_by_reason,
                  "in_flight": found.in_flight_by_state}.get(name)  # fmt: skip
        lines += [f"    {key}: {n}" for key, n in sorted((detail or {}).items())]
    lines.append(f"unexplained: {found.unexplained}")
    lines += [
        f"  {u.task_id}  {u.why}  pushed {utc_text(u.noted_ms)}" for u in found.unexplained_ids
    ]
    if found.unexplained > len(found.unexplained_ids):
        lines.append(f"  ... and {found.unexplained - len(found.unexplained_ids)} more")
    return lines


class Command(BaseCommand):
    help = "Reconcile what was pushed with what committed, failed, was cancelled or runs."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--since", default="24h", help="how far back: 90s, 15m, 24h, 2d (default 24h); "
            "at most AUDIT_HORIZON_S, which the ledger keeps"
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", dest="as_json", help="one JSON object")
        parser.add_argument(
            "--check", action="store_true", help="exit 1 when any task is unexplained"
        )
        parser.add_argument("--limit", type=int, default=1000, help="unexplained ids listed")

    def handle(self, *args: Any, **options: Any) -> None:
        cfg = conf.get_config()
        keys = KeySpace.of(cfg)
        since_s = parse_since(options["since"])
        if options["limit"] < 0:
            raise CommandError("--limit must be >= 0")
        # The scanner finds a task past its deadline within a scan interval and a
        # second (G3): until then it is in flight within its bound.
        slack_ms = int((cfg.scan_interval_s + 1.0) * 1000)
        try:
            client = sync_client(cfg)
            since_ms = now(client) - int(min(since_s * 1000, keys.ledger_ms or since_s * 1000))
            found = audit(client, keys, since_ms, slack_ms, options["limit"])
        except RedisError as exc:
            raise CommandError(
                f"relier's Redis cannot be read at {conf.redis_location()}: {exc}"
            ) from exc
        if options["as_json"]:
            self.stdout.write(json.dumps(found.to_json(), sort_keys=True))
        else:
            self.stdout.write("\n".join(render(found)))
        if options["check"] and found.unexplained:
            raise SystemExit(1)
