"""What happened, read back after the run from sources that survive the faults.

- **Executions**: each workload task journals its start and end to a file of its own
  process (``testproject/demo/tasks.py``, ``_journal``): no Redis involved.
- **Commits**: relier's worker logs one ``committed task_id=... fence=...`` line per
  ``commit.lua`` that accepted (log files), and the result key keeps the committed
  value, which names the fence that produced it (Redis, AOF). A commit whose log line
  was lost (a SIGKILL right after the script returned) is still seen through the
  result key.
- **Refusals**: the ``stale commit rejected``, ``incarnation cancelled``, ``message
  refused`` ... lines of the same logs.
- **Outcomes, the DLQ, leftovers**: read from Redis once the run has drained.

Every read of the store goes through the key space of the configuration in force
(:func:`keys`): the scenario's own while the runner points this process at its servers
(``runner.pointed_at``). On a partitioned store (``RELIER_PARTITIONS``,
``RELIER_CLUSTER``) the per-partition indexes (expiry, DLQ) are read in every partition
(``KeySpace.parts()``), and on a Redis Cluster every master is scanned for leftovers
and task hashes, and multi-key reads are split by slot.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psutil
import redis
from amqp.exceptions import NotFound
from kombu.connection import Connection
from redis.cluster import RedisCluster

from relier_django.core.model.config import Config, current
from relier_django.core.observe.audit import Audit, audit
from relier_django.core.store.keys import KeySpace
from testproject.rabbitmq import RabbitServer

# The chaos processes run with relier's default recovery queue.
_DEFAULTS = Config()
TASK_QUEUES = ("celery", _DEFAULTS.recovery_queue)


def keys() -> KeySpace:
    """The store's key space as the configuration in force lays it out: the scenario's
    processes' during a run (its prefix, its partitions), relier's defaults outside."""
    return KeySpace.of(current())


class _KeysInForce:
    """:func:`keys`, read at each use: ``KEYS.task(id)`` names the task's hash in the
    layout of the run under way, whichever scenario imported ``KEYS``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(keys(), name)

    def __repr__(self) -> str:
        return f"KEYS -> {keys()!r}"


KEYS = cast(KeySpace, _KeysInForce())
UNACKED = "unacked"  # kombu's Redis transport: messages delivered, not yet acknowledged


@dataclass(frozen=True)
class Pushed:
    """One acknowledged push (``push()`` returned) and what the scenario expects of it:
    ``"commit"``, or the DLQ reason it must land with."""

    task_id: str
    label: str
    task: str
    expect: str = "commit"
    at: float = 0.0


@dataclass(frozen=True)
class Execution:
    event: str  # start | end | soft
    task_id: str
    fence: int
    pid: int
    worker: str
    at: float


@dataclass(frozen=True)
class LogEvent:
    kind: str  # committed | stale_commit | cancelled | gave_up | refused | dead_lettered
    task_id: str
    fence: int | None
    source: str  # the log file's name
    detail: str = ""


@dataclass(frozen=True)
class DlqRecord:
    entry_id: str
    task_id: str
    reason: str
    fence: int | None
    checkpoint: Any = None
    raw: str | None = None  # for a message that could not be tied to a task


@dataclass
class Evidence:
    pushed: dict[str, Pushed]
    executions: list[Execution] = field(default_factory=list)
    log_events: list[LogEvent] = field(default_factory=list)
    outcomes: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    dlq: dict[str, DlqRecord] = field(default_factory=dict)  # tied to a task, by task id
    untied: list[DlqRecord] = field(default_factory=list)  # msg-* entries: raw bodies
    leaked_keys: list[str] = field(default_factory=list)
    keys_without_ttl: list[str] = field(default_factory=list)
    kept_keys: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    # Workers declared dead by their connection whose process still lived at the drain.
    found_dead_alive: list[str] = field(default_factory=list)
    # manage.py relier_audit's reading of the whole ledger after the drain (issue 40).
    audit: Audit | None = None

    def executions_of(self, task_id: str, event: str | None = None) -> list[Execution]:
        return [
            e
            for e in self.executions
            if e.task_id == task_id and (event is None or e.event == event)
        ]

    def events_of(self, task_id: str, *kinds: str) -> list[LogEvent]:
        return [
            e for e in self.log_events if e.task_id == task_id and (not kinds or e.kind in kinds)
        ]


# -- the journal ---------------------------------------------------------------------------
def read_journal(directory: Path) -> list[Execution]:
    out = []
    for path in sorted(directory.glob("exec-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # cannot happen with one write(2) per line; never trust it though
            out.append(
                Execution(
                    rec["ev"],
                    rec["id"],
                    int(rec["fence"]),
                    int(rec["pid"]),
                    rec.get("worker", ""),
                    float(rec["t"]),
                )
            )
    return sorted(out, key=lambda e: e.at)


# -- the logs ------------------------------------------------------------------------------
_LOG_PATTERNS = {
    # Task ids are relier's hex uuids, or Celery's dashed ones (a workflow's later steps).
    "committed": re.compile(r"committed task_id=([\w-]+) fence=(\d+)"),
    "stale_commit": re.compile(r"stale commit rejected task_id=([\w-]+) fence=(\d+)"),
    "cancelled": re.compile(r"incarnation cancelled: superseded task_id=([\w-]+) fence=(\d+)"),
    "gave_up": re.compile(r"incarnation gave up: superseded task_id=([\w-]+) fence=(\d+)"),
    "refused": re.compile(r"message refused task_id=([\w-]+) fence=(\d+) reason=(\w+)"),
    "stale_dead_letter": re.compile(r"stale dead-letter rejected task_id=([\w-]+) fence=(\d+)"),
    "dead_lettered": re.compile(r"dead-lettered task_id=(\S+) reason=(\w+)"),
    # A scanner's verdict on a holder whose liveness connection left (recovery/deaths.py):
    # the worker id ends in the process's pid.
    "found_dead": re.compile(r"holder found dead \(its connection is gone\) worker=(\S+):(\d+)"),
}
# How a stale incarnation learns it is stale, in its own worker's log: at start (a
# replayed start.lua after a lost reply), from a heartbeat (cancelled, gave up), or at
# commit / dead-letter time.
ZOMBIE_REFUSALS = ("refused", "stale_commit", "cancelled", "gave_up", "stale_dead_letter")


def parse_log_line(line: str, source: str) -> LogEvent | None:
    for kind, pattern in _LOG_PATTERNS.items():
        m = pattern.search(line)
        if m is None:
            continue
        if kind == "dead_lettered":
            return LogEvent(kind, m.group(1), None, source, m.group(2))
        if kind == "found_dead":  # task_id holds the worker id, fence its pid
            return LogEvent(kind, f"{m.group(1)}:{m.group(2)}", int(m.group(2)), source)
        detail = m.group(3) if kind == "refused" else ""
        return LogEvent(kind, m.group(1), int(m.group(2)), source, detail)
    return None


def read_logs(paths: Iterable[Path]) -> list[LogEvent]:
    out = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            event = parse_log_line(line, path.name)
            if event is not None:
                out.append(event)
    return out


# -- Redis ---------------------------------------------------------------------------------
def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def _masters(client: Any) -> list[Any]:
    """A client of each server that holds keys: ``client`` itself, or each master of a
    cluster as the cluster sees itself now (``CLUSTER NODES``, not the client's cached
    map, which a failover may have left behind), each through ``client``'s pool."""
    if not is_cluster(client):
        return [client]
    masters = []
    for address, node in client.cluster_nodes().items():
        flags = set(str(node["flags"]).split(","))
        if "master" not in flags or flags & {"fail", "fail?", "noaddr"} or not node["slots"]:
            continue
        host, port = address.rsplit(":", 1)
        found = client.get_node(host=host, port=int(port))
        if found is None:  # a node the client has not met yet (a restarted one)
            client.nodes_manager.initialize()
            found = client.get_node(host=host, port=int(port))
        if found is None:
            raise redis.exceptions.ConnectionError(f"no connection to master {address}")
        masters.append(client.get_redis_connection(found))
    return masters


def scan_all(client: Any, match: str | None) -> Iterator[str]:
    """Every key matching ``match`` (all with None) on every server of the store: a
    cluster's keys are scanned on each master."""
    for server in _masters(client):
        for raw in server.scan_iter(match=match, count=1000):
            yield raw.decode() if isinstance(raw, bytes) else raw


def _mget(client: Any, names: Sequence[str]) -> list[Any]:
    # A cluster refuses one MGET over several slots: redis-py splits it by slot.
    return list(client.mget_nonatomic(names) if is_cluster(client) else client.mget(names))


def read_outcomes(client, task_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
    space = keys()
    out: dict[str, dict[str, Any] | None] = {}
    for start in range(0, len(task_ids), 500):
        chunk = task_ids[start : start + 500]
        found = _mget(client, [space.result(t) for t in chunk])
        for task_id, raw in zip(chunk, found, strict=True):
            out[task_id] = json.loads(raw) if raw else None
    return out


def read_dlq(client) -> tuple[dict[str, DlqRecord], list[DlqRecord]]:
    from relier_django.core.dlq.store import DeadLetterStore

    space = keys()
    store = DeadLetterStore(client, space)
    tied: dict[str, DlqRecord] = {}
    untied: list[DlqRecord] = []
    for part in space.parts():
        for entry_id in client.zrange(part.dlq, 0, -1):
            entry = store.get(entry_id)
            if entry is None:
                continue
            raw = entry.data.get("raw")
            record = DlqRecord(
                entry.id, entry.summary.task_id, entry.reason, entry.fence, entry.checkpoint, raw
            )
            if entry.fence is None:
                untied.append(record)
            else:
                tied[record.task_id] = record
    return tied, untied


def read_leftovers(client) -> tuple[list[str], list[str], dict[str, int]]:
    """G7, as tests/leaks.py has it: after a drain only results and idempotency claims
    (each with a TTL), admission counters (TTL), DLQ entries and the scanner lease may
    remain. Returns (leaked, without a TTL that they need, kept by kind).

    A plain Redis is shared with the broker: its keys of the store's prefix are read. A
    cluster holds the store alone (it is no Celery broker): every key of every master
    is read, and any that is not the store's is leaked too."""
    space = keys()
    with_ttl, owned = space.expiring_patterns(), space.owned_patterns()
    leaked, no_ttl, kept = [], [], Counter()
    match = None if is_cluster(client) else space.all_pattern()
    for key in scan_all(client, match):
        expiring = next((p for p in with_ttl if fnmatch.fnmatchcase(key, p)), None)
        if expiring is not None:
            kept[expiring] += 1
            if client.ttl(key) < 0:
                no_ttl.append(key)
            continue
        holder = next((p for p in owned if fnmatch.fnmatchcase(key, p)), None)
        if holder is None:
            leaked.append(key)
        else:
            kept[holder] += 1
    return sorted(leaked), sorted(no_ttl), dict(kept)


def _task_pattern(space: KeySpace) -> str:
    # Every partition's task hashes: Redis' glob takes braces as plain characters.
    return f"{space.root}:{{*}}:t:{{*}}" if space.tagged else space.task("*")


def in_flight(client) -> dict[str, int]:
    space = keys()
    hashes = sum(1 for _ in scan_all(client, _task_pattern(space)))
    expiry = sum(int(client.zcard(part.expiry)) for part in space.parts())
    return {"expiry index": expiry, "task hashes": hashes}


def queued(client) -> dict[str, int]:
    depth = {}
    for queue in TASK_QUEUES:
        total = 0
        for key in client.scan_iter(match=f"{queue}*", count=1000):
            if client.type(key) in ("list", b"list"):
                total += int(client.llen(key))
        depth[queue] = total
    depth[UNACKED] = int(client.hlen(UNACKED))
    return depth


def rabbit_queued(node: RabbitServer, queues: Sequence[str] = TASK_QUEUES) -> dict[str, int]:
    """``queued`` for a RabbitMQ broker, read live: the messages ready in each of
    ``queues`` (a passive declare: the queue's own count; 0 for one never declared) and
    the messages delivered and not yet acknowledged on the whole node (each channel's
    own count). Not ``rabbitmqctl list_queues``: for a quorum queue it reports metrics
    refreshed every few seconds, and 0 for seconds after a restart.

    Raises:
        RabbitError: ``rabbitmqctl`` failed.
        OSError, amqp.exceptions.AMQPError: the node is down or not serving yet.
    """
    depth = {}
    with Connection(node.url, connect_timeout=2) as conn:
        for queue in queues:
            channel = conn.channel()  # a failed passive declare closes its channel
            try:
                depth[f"{queue} ready"] = int(channel.queue_declare(queue, passive=True)[1])
            except NotFound:
                depth[f"{queue} ready"] = 0
            else:
                channel.close()
    listed = node.ctl("list_channels", "messages_unacknowledged", "--quiet", "--no-table-headers")
    depth["unacked on the node"] = sum(int(n) for n in listed.split())
    return depth


def _lives(pid: int) -> bool:
    # A killed pool process its worker has not reaped yet is a zombie: dead, though its
    # pid still exists (Celery's main process may take seconds to reap it).
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def collect(
    client,
    pushed: dict[str, Pushed],
    journal: Path,
    logs: Iterable[Path],
    broker_queued: dict[str, int] | None = None,
) -> Evidence:
    """Everything the checker needs; ``client`` must decode responses. ``broker_queued``:
    the broker's depths when it is not kombu's Redis transport on ``client``'s server
    (``rabbit_queued``)."""
    tied, untied = read_dlq(client)
    leaked, no_ttl, kept = read_leftovers(client)
    events = read_logs(logs)
    return Evidence(
        pushed=dict(pushed),
        executions=read_journal(journal),
        log_events=events,
        outcomes=read_outcomes(client, list(pushed)),
        dlq=tied,
        untied=untied,
        leaked_keys=leaked,
        keys_without_ttl=no_ttl,
        kept_keys=kept,
        in_flight=in_flight(client),
        queued=queued(client) if broker_queued is None else broker_queued,
        found_dead_alive=[
            e.task_id
            for e in events
            if e.kind == "found_dead" and e.fence is not None and _lives(e.fence)
        ],
        audit=read_audit(client),
    )


def read_audit(client) -> Audit:
    """relier_audit over everything the run's ledger noted: after the drain, each push
    is committed, dead-lettered or cancelled (in flight only within its bound)."""
    cfg = current()
    return audit(client, keys(), 0, int((cfg.scan_interval_s + 1.0) * 1000), limit=20)
