"""One frozen, typed configuration object; every default is written here and nowhere else.

The Django layer (``relier_django.conf``) builds a :class:`Config` from
``settings.RELIER`` and ``RELIER_*`` environment variables and installs a provider
with :func:`set_provider`. Code outside Django may build one by hand.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import rates, signing
from .errors import ConfigError
from .limits import NamedLimit, named_limits
from .rates import Rate
from .redaction import redact
from .resurrections import ResurrectionPolicy


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the core reads. Durations carry their unit in the name."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "rl"
    # How long a committed result (and an idempotent task's cached result) is kept.
    result_ttl_s: int = 24 * 3600
    # The delivery ledger relier_audit reconciles: every stored task is noted for this
    # long (about 40 bytes each in Redis). None: result_ttl_s, the most it may be (an
    # outcome kept shorter than the ledger could not explain a task still noted); 0: off.
    audit_horizon_s: int | None = None
    # Liveness of a running task: refreshed every heartbeat_interval_s, expires after ttl.
    heartbeat_ttl_s: float = 10.0
    heartbeat_interval_s: float | None = None
    max_resurrections: int = 3
    # Limits by cause of death for every task that names none of its own for that cause:
    # 'cause=n' entries, from the settings dict {"oom": 0} (model/resurrections.py).
    resurrections_by_cause: tuple[str, ...] = ()
    max_retries: int = 3
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 300.0
    # A task stored at push but not started within this long is re-dispatched (fenced,
    # so at most one copy runs). Covers a producer dying between store and send; keep
    # it above the longest backlog wait you expect.
    queued_grace_s: float = 3600.0
    # Where resurrected tasks are re-dispatched; workers consume it automatically.
    recovery_queue: str = "relier.recovery"
    # The resurrector: how often it scans, and its brakes.
    scan_interval_s: float = 2.0
    resurrect_batch: int = 500  # expired tasks handled per pass
    resurrect_lease_s: float = 30.0  # a pass's hold on a task while it re-dispatches it
    recovery_max_depth: int = 10_000  # defer (and log) while the recovery queue is deeper
    max_concurrent_sends: int = 16  # broker publishes in flight per pass
    # The scanner leader's lease; None: three scan intervals. The leader extends it at
    # every pass, and a leader that died is replaced once it runs out.
    leader_lease_s: float | None = None
    embedded_resurrector: bool = True  # every worker runs a scanner (one leads at a time)
    # On SIGTERM (warm shutdown), running tasks get this long to finish in place; the
    # rest are handed off to resurrection at once. Reserved tasks are handed off at once.
    drain_timeout_s: float = 30.0
    # Socket timeout for Redis calls made by the core.
    redis_socket_timeout_s: float = 5.0
    # How long a client keeps retrying a connection error before it raises: at least
    # this, at most twice (backoff with jitter). Longer than a restart or a failover
    # takes; tests of an unreachable Redis shorten it (store/retrying.py).
    redis_retry_s: float = 3.75
    # How long a push sent at once (push()/apush() outside a transaction) waits for
    # Redis before it raises PushFailed: one budget for its retries and each connect or
    # read, so a web request can answer 503 soon. Workers keep redis_retry_s.
    push_wait_s: float = 1.0
    # Redis Sentinel: when set, the master named sentinel_master is found through these
    # "host:port" sentinels, and redis_url gives only credentials, db and TLS options.
    sentinels: tuple[str, ...] = ()
    sentinel_master: str | None = None
    # The sentinels' own password (their requirepass), if they have one; never printed.
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)
    # Checkpoints (ctx.set_partial) up to this size live in Redis, with the task.
    checkpoint_max_bytes: int = 65_536
    # Larger ones go to files here (Redis keeps a reference); unset: they are refused.
    checkpoint_dir: str | None = None
    # A push whose encoded task (its arguments, mostly) is larger is refused: Redis keeps
    # it until the result expires. Large data belongs elsewhere, passed by reference.
    arguments_max_bytes: int = 1_048_576
    # A result whose encoded record is larger is not stored: the task is dead-lettered
    # at once (result_too_large), its body run once. Redis keeps a result for
    # result_ttl_s, and may refuse a huge one outright, which would otherwise leave the
    # task to be run again at every resurrection. The arguments' figure, for symmetry:
    # what one task may hand in, it may hand back.
    result_max_bytes: int = 1_048_576
    # Rate limiter (relier_django.ratelimit): the reverse proxies (IPs or CIDR networks)
    # whose X-Forwarded-For is believed, and what a view does when Redis is unreachable.
    trusted_proxies: tuple[str, ...] = ()
    ratelimit_fail_open: bool = True
    # Admission control on push: a rate for all pushes together ("1000/s"), and rates
    # per task name ("shop.charge=100/s"), which win over @rl_task(admission_limit=...).
    admission_limit: str | None = None
    admission_task_limits: tuple[str, ...] = ()
    # Named flow-control limits: 'name=<JSON>' entries, from the settings dict
    # {"stripe": {"concurrency": 5, "rate": "100/s", "per_key": False}} (model/limits.py).
    limits: tuple[str, ...] = ()
    # HMAC-SHA256 envelope signing: the first key signs, every key verifies, so keys
    # rotate without refusing a task (docs/rolling-deploys.md). Never printed.
    signing_keys: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    # Only while rolling signing out: accept envelopes that carry no signature at all.
    signing_accept_unsigned: bool = False
    # Tests: push() runs the task in this process and never touches Redis or the
    # broker, as Celery's task_always_eager (which turns it on too); docs/testing.md.
    eager: bool = False
    # Tests: eager, and a push inside a transaction runs at once too, as Celery's
    # task_always_eager does, instead of at the commit (which a test wrapped in a
    # transaction, pytest-django's django_db, never reaches); docs/testing.md.
    eager_immediate: bool = False
    # Cluster-wide counters and histograms (docs/observability.md), kept by the Lua
    # scripts that do each act. False: the scripts count nothing (the benchmark's "off").
    metrics: bool = True
    # The success ratio the SLO figures measure against (relier_slo_*): 0.999 = 99.9 %.
    slo_objective: float = 0.999
    # The store on a Redis Cluster: redis_url names any of its nodes (docs/scaling.md).
    cluster: bool = False
    # How many partitions the store is split into, each on one cluster hash slot, so
    # that a cluster spreads them over its masters; fixed for a store's life (recorded
    # in it, and a process configured otherwise refuses to start). 1: unpartitioned.
    partitions: int = 1

    def __post_init__(self) -> None:
        found = self.problems()
        if found:
            raise ConfigError("; ".join(field + text for field, text in found), found)

    def problems(self) -> list[tuple[str, str]]:
        """Every value that cannot work, not only the first: ``(field, text)`` pairs
        whose ``field + text`` reads as a sentence ("resurrect_batch must be >= 1")."""
        found: list[tuple[str, str]] = []
        if self.heartbeat_ttl_s <= 0:
            found.append(("heartbeat_ttl_s", " must be > 0"))
        if self.heartbeat_interval_s is not None and not (
            0 < self.heartbeat_interval_s < self.heartbeat_ttl_s
        ):
            found.append((
                "heartbeat_interval_s",
                f" ({self.heartbeat_interval_s}) must be > 0 and below heartbeat_ttl_s "
                f"({self.heartbeat_ttl_s}), or a task's heartbeat expires between two refreshes",
            ))  # fmt: skip
        for name in (
            "resurrect_batch", "max_concurrent_sends", "checkpoint_max_bytes",
            "arguments_max_bytes", "result_max_bytes",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                found.append((name, " must be >= 1"))
        for name in ("scan_interval_s", "resurrect_lease_s", "leader_lease_s", "push_wait_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:  # leader_lease_s may be None (derived)
                found.append((name, " must be > 0"))
        for name in (
            "drain_timeout_s", "max_resurrections", "max_retries", "result_ttl_s",
            "recovery_max_depth", "redis_retry_s",
        ):  # fmt: skip
            if getattr(self, name) < 0:
                found.append((name, " must be >= 0"))
        if self.audit_horizon_s is not None and not (
            0 <= self.audit_horizon_s <= self.result_ttl_s
        ):
            found.append((
                "audit_horizon_s",
                f" ({self.audit_horizon_s}) must be >= 0 (0: no ledger) and at most "
                f"result_ttl_s ({self.result_ttl_s}): the audit explains a finished task "
                "by its outcome record, which is kept result_ttl_s",
            ))  # fmt: skip
        if not 0 < self.slo_objective < 1:
            found.append(
                ("slo_objective", f" must be > 0 and < 1, e.g. 0.999, not {self.slo_objective}")
            )
        found += self._cluster_problems()
        if not self.key_prefix or any(c in self.key_prefix for c in "{} "):
            found.append(("key_prefix", " must be non-empty, without braces or spaces"))
        checks: tuple[tuple[str, Callable[[], object]], ...] = (
            ("trusted_proxies", lambda: _check_networks("trusted_proxies", self.trusted_proxies)),
            ("signing_keys", lambda: signing.check_keys(self.signing_keys, "signing_keys")),
            ("sentinels", self._check_sentinels),
            ("admission_task_limits", self.task_admission_limits),
            ("limits", self.named_limits),
            ("resurrections_by_cause", self.resurrection_policy),
            ("admission_limit", lambda: self.admission_limit is None
                or _rate("admission_limit", self.admission_limit)),
        )  # fmt: skip
        for name, check in checks:
            try:
                check()
            except ConfigError as exc:
                message = str(exc)
                # The helpers' messages start with the field's name (or another field's,
                # for the sentinel pair): keep the sentence whole either way.
                field = max((f for f in FIELDS if message.startswith(f)), key=len, default=name)
                found.append(
                    (field, message[len(field) :] if message.startswith(field) else f": {message}")
                )
        return found

    def _cluster_problems(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if not 1 <= self.partitions <= 1024:
            found.append(("partitions", f" must be between 1 and 1024, not {self.partitions}"))
        if self.cluster and self.sentinels:
            found.append((
                "cluster",
                ": a Redis Cluster fails over by itself; set CLUSTER or SENTINELS, not both",
            ))  # fmt: skip
        return found

    def named_limits(self) -> Mapping[str, NamedLimit]:
        """``limits`` as name -> limit (parsed once per distinct value)."""
        return _named_limits(self.limits)

    def resurrection_policy(self) -> ResurrectionPolicy:
        """``max_resurrections`` and ``resurrections_by_cause``: the limits of a task that
        names none of its own (``resurrections.stored`` merges a task's over them)."""
        return _resurrection_policy(self.max_resurrections, self.resurrections_by_cause)

    def task_admission_limits(self) -> dict[str, Rate]:
        """``admission_task_limits`` as task name -> rate."""
        limits: dict[str, Rate] = {}
        for entry in self.admission_task_limits:
            name, sep, text = entry.partition("=")
            if not (sep and name.strip()):
                raise ConfigError(
                    f"admission_task_limits: {entry!r} is not 'task.name=RATE' (e.g. "
                    "'shop.charge=100/s')"
                )
            limits[name.strip()] = _rate(f"admission_task_limits[{name.strip()}]", text)
        return limits

    def __repr__(self) -> str:
        # The generated repr would print REDIS_URL's password wherever a config is shown
        # (tracebacks with locals, error trackers that capture frames): redact it.
        shown = []
        for f in dataclasses.fields(self):
            if f.repr:
                value = getattr(self, f.name)
                shown.append(f"{f.name}={redact(value) if f.name == 'redis_url' else value!r}")
        return f"Config({', '.join(shown)})"

    def sentinel_addresses(self) -> tuple[tuple[str, int], ...]:
        """``sentinels`` as (host, port) pairs (``"[::1]:26379"`` for IPv6).

        Raises:
            ConfigError: an entry is not ``host:port``.
        """
        if not isinstance(self.sentinels, tuple):  # a bare string would be its characters
            raise ConfigError(f"sentinels must be a tuple of 'host:port', got {self.sentinels!r}")
        addresses = []
        for entry in self.sentinels:
            host, sep, port = entry.rpartition(":")
            host = host.removeprefix("[").removesuffix("]")
            if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                raise ConfigError(
                    f"sentinels: {entry!r} is not 'host:port' (e.g. '10.0.0.5:26379')"
                )
            addresses.append((host, int(port)))
        return tuple(addresses)

    def _check_sentinels(self) -> None:
        self.sentinel_addresses()
        if self.sentinels and not self.sentinel_master:
            raise ConfigError(
                "sentinels is set but sentinel_master is not: give the name the sentinels "
                "monitor the master under (their 'sentinel monitor <name> ...' line)"
            )
        if self.sentinel_master and not self.sentinels:
            raise ConfigError("sentinel_master is set but sentinels is empty: list the sentinels")
        if self.sentinels and self.redis_url.startswith("unix:"):
            raise ConfigError(
                "a unix:// redis_url cannot be combined with sentinels: sentinels name a TCP "
                "address; use redis:// or rediss:// for the credentials, db and TLS options"
            )

    @property
    def signer(self) -> signing.Signer | None:
        """Signs and verifies envelopes with ``signing_keys``; None when there are none."""
        return signing.signer(self.signing_keys, self.signing_accept_unsigned)

    @property
    def audit_horizon_ms(self) -> int:
        """How long the delivery ledger keeps a task noted, ms; 0: no ledger."""
        horizon = self.result_ttl_s if self.audit_horizon_s is None else self.audit_horizon_s
        return int(horizon * 1000)

    @property
    def heartbeat_every_s(self) -> float:
        """The refresh period actually used: explicit, or a third of the TTL."""
        return self.heartbeat_interval_s or self.heartbeat_ttl_s / 3

    @property
    def leader_lease_ttl_s(self) -> float:
        """The leader lease actually used: explicit, or three scan intervals, so a
        leader may miss two passes (a slow broker, a pause) before another takes over."""
        return self.leader_lease_s or 3 * self.scan_interval_s

    def replace(self, **changes: object) -> Config:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _rate(name: str, text: str) -> Rate:
    try:
        return rates.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from exc


def _check_networks(name: str, values: tuple[str, ...]) -> None:
    if not isinstance(values, tuple):  # a bare string would be read as its characters
        raise ConfigError(f"{name} must be a tuple of IPs or CIDR networks, got {values!r}")
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError as exc:
            raise ConfigError(f"{name}: {value!r} is not an IP address or CIDR network") from exc


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))

_lock = threading.Lock()
_provider: Callable[[], Config] = Config
_override: Config | None = None


def set_provider(provider: Callable[[], Config]) -> None:
    """Install the function that builds the current config (the Django layer does this)."""
    global _provider
    with _lock:
        _provider = provider


def override(config: Config | None) -> None:
    """Pin a config regardless of the provider (tests, scripts); ``None`` unpins."""
    global _override
    with _lock:
        _override = config


def current() -> Config:
    """The config in force. The provider is expected to cache."""
    return _override if _override is not None else _provider()


@functools.cache
def _named_limits(entries: tuple[str, ...]) -> Mapping[str, NamedLimit]:
    # Asked at every push of a task with limit=: parsed once per settings value.
    return named_limits(entries)


@functools.cache
def _resurrection_policy(default: int, entries: tuple[str, ...]) -> ResurrectionPolicy:
    pairs: dict[str, int] = {}
    for entry in entries:
        cause, sep, text = (part.strip() for part in entry.partition("="))
        if not (sep and cause and text.isdigit()) or cause == "default":
            raise ConfigError(
                f"resurrections_by_cause: {entry!r} is not 'cause=N' with N >= 0 (e.g. "
                "'oom=0'; the limit of every other cause is MAX_RESURRECTIONS)"
            )
        pairs[cause] = int(text)
    try:
        found = ResurrectionPolicy.parse(pairs, "resurrections_by_cause")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return dataclasses.replace(found, default=default)
