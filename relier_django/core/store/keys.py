"""The whole Redis key schema. Nothing else in relier_django builds a key string.

Per-task keys share a ``{task_id}`` hash tag. Each script has one method here that
returns its KEYS in the order its ``.lua`` header declares.

**Partitions** (``RELIER["PARTITIONS"]`` > 1, or ``RELIER["CLUSTER"]``): the store is
split into partitions, each a complete store under ``<p>:{<tag>}``, so that every key
one script touches hashes to one Redis Cluster slot. A task lives in the partition of
its id (:meth:`KeySpace.partition_of`); an idempotency claim in the partition of its
key, and the producer draws the task's id there (:meth:`KeySpace.new_id`), as a
workflow draws every step's id in its first task's partition. Each partition's tag is
chosen so that the partitions spread evenly over the slot ranges a cluster's masters
own (:func:`partition_tags`). Keys not tied to a task (the scanner lease, periodic
entries, worker presence) share the tag ``{g}``; locks and rate limiters keep their own
tags. Readers of the whole (DLQ listings, metrics, the scanner) visit every partition
(:meth:`KeySpace.parts`). With one partition and no cluster, the layout below is
exactly the unpartitioned one: ``<p>`` is the prefix.

| key                         | type   | owner / lifetime                                        |
|-----------------------------|--------|---------------------------------------------------------|
| ``<p>:t:{id}``              | hash   | the task while unfinished; deleted by commit / DLQ      |
| ``<p>:h:{id}``              | list   | incarnation history; deleted by commit, copied to DLQ   |
| ``<p>:r:{id}``              | string | the outcome a receipt reads; TTL ``result_ttl_s``       |
| ``<p>:i:<task>:<sha256>``   | string | idempotency claim -> task id; TTL set at commit, CAD'd  |
| ``<p>:adm:all``, ``:adm:t:<task>`` | string | push admission counters; TTL: rest of window |
| ``<p>:expiry``              | zset   | task id -> deadline (ms, Redis clock); the scan index   |
| ``<p>:sched``               | zset   | scheduled task id -> due time (ms, Redis clock)         |
| ``<p>:sched:wake``          | list   | the earliest due time, to wake the scanner leader (1 el.)|
| ``<p>:dlq``                 | zset   | DLQ entry id -> dead-lettered at (ms): the time index   |
| ``<p>:dlq:e:{id}``          | hash   | one DLQ entry; deleted only by release, delete, purge   |
| ``<p>:dlq:x``               | zset   | DLQ lex index for filtered, cursor-paged listings       |
| ``<p>:dlq:n``               | hash   | DLQ counts by task, by reason, by both                  |
| ``<p>:resurrector:leader``  | string | scanner leader lease; TTL, extended by its holder       |
| ``<p>:periodic``            | hash   | periodic entry -> last tick handled (ms); no TTL, owned |
| ``<p>:periodic:claims``     | hash   | entry -> '<tick>:<deadline>:<token>' while it pushes  |
| ``<p>:lock:{name}``         | string | a named lock's holder token; TTL, extended by its holder |
| ``<p>:lock:{name}:token``   | string | a named lock's fencing counter; no TTL, never goes back  |
| ``<p>:lock:{name}:by``      | string | attempt id that took the current token; TTL one lock TTL |
| ``<p>:rcpt:<token>``        | string | a call's reply, for its replay after a lost reply; TTL   |
| ``<p>:rl:{<scope>:<sha256>}`` | hash | a rate limiter's window {w, c, p}; TTL 2 windows        |
| ``<p>:lim:<scope>:run``     | hash   | flow control: task id -> fence, the slots held (G14)     |
| ``<p>:lim:<scope>:ring``    | list   | the keys with parked tasks, in turn order; empties      |
| ``<p>:lim:<scope>:w:<key>`` | list   | the ids parked under one key, in push order; empties    |
| ``<p>:lim:<scope>:tat``     | string | a rate's theoretical arrival time (ms); TTL past it     |
| ``<p>:lim_scopes``          | set    | the scopes with slots held or tasks parked; empties     |
| ``<p>:lim_rates``           | zset   | rate scope -> its reservation's expiry (ms); TTL        |
| ``<p>:m``                   | hash   | metrics: counters, histogram buckets; no TTL, bounded   |
| ``<p>:m:w``                 | hash   | metrics: per-minute (120) and per-hour (80) ring slots  |
| ``<p>:workers``             | zset   | worker main process id -> liveness deadline (ms)        |
| ``<p>:holders``             | set    | ids of processes holding a liveness connection          |
| ``<p>:layout``              | string | '<partitions>:tagged|plain', by the first worker; no TTL |
| ``<p>:ledger``              | stream | the delivery ledger (relier_audit): trimmed, TTL horizon |
| ``<p>:ho``                  | zset   | hand-overs: committed id -> commit time (ms); empties   |
| ``<p>:ho:e``                | hash   | hand-overs: committed id -> its successors; empties     |
| ``<p>:hd:{id}``             | string | a successor a hand-over stored -> its token; TTL        |
"""

from __future__ import annotations

import functools
import hashlib
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ..model.config import Config


@functools.lru_cache(maxsize=8)
def partition_tags(partitions: int) -> tuple[str, ...]:
    """One hash tag per partition: partition k's tag hashes into the k-th of
    ``partitions`` equal slot ranges. ``redis-cli --cluster create`` gives each master
    an equal, contiguous range, so partitions spread evenly over any number of masters
    that divides them, and nearly evenly otherwise."""
    tags = []
    for k in range(partitions):
        low = k * REDIS_CLUSTER_HASH_SLOTS // partitions
        high = (k + 1) * REDIS_CLUSTER_HASH_SLOTS // partitions
        n = 0
        # The first candidate in range: deterministic, so every process agrees.
        while not low <= key_slot(f"p{k}.{n}".encode()) < high:
            n += 1
        tags.append(f"p{k}.{n}")
    return tuple(tags)


@dataclass(frozen=True, slots=True)
class KeySpace:
    prefix: str = "rl"
    # False (RELIER["METRICS"] = False): the scripts get the absent key for the metrics
    # keys and count nothing.
    metrics: bool = True
    partitions: int = 1
    # Keys carry partition tags (partitions > 1, or a Redis Cluster even with one).
    tagged: bool = False
    # The partition this space is (its prefix then ends with the partition's tag);
    # None: the whole store.
    partition: int | None = None
    base: str = ""  # the configured prefix, without any tag ('' means prefix)
    # How long the delivery ledger keeps a stored task noted (ms); 0: push.lua and
    # commit.lua note nothing (AUDIT_HORIZON_S = 0).
    ledger_ms: int = 0

    @classmethod
    def of(cls, config: Config) -> KeySpace:
        """The key space a configuration names (its prefix, metrics on or off, its
        partitions)."""
        tagged = config.partitions > 1 or config.cluster
        return cls(
            config.key_prefix, config.metrics, config.partitions, tagged,
            ledger_ms=config.audit_horizon_ms,
        )  # fmt: skip

    # -- partitions ----------------------------------------------------------------
    @property
    def root(self) -> str:
        return self.base or self.prefix

    def partition_of(self, ident: str) -> int:
        """The partition of a task id (or of any id whose keys go with it)."""
        if self.partitions == 1:
            return 0
        return zlib.crc32(ident.encode()) % self.partitions

    def at(self, partition: int) -> KeySpace:
        """Partition ``partition``'s own key space (``self`` when keys are untagged)."""
        if not self.tagged:
            return self
        tag = partition_tags(self.partitions)[partition]
        return KeySpace(
            f"{self.root}:{{{tag}}}", self.metrics, self.partitions, True, partition, self.root,
            self.ledger_ms,
        )  # fmt: skip

    def of_task(self, task_id: str) -> KeySpace:
        """The key space of the partition ``task_id`` lives in."""
        if not self.tagged:
            return self
        return self.at(self.partition_of(task_id))

    def parts(self) -> list[KeySpace]:
        """Every partition's key space, for readers of the whole store."""
        if not self.tagged:
            return [self]
        return [self.at(k) for k in range(self.partitions)]

    def new_id(self, near: str | None = None) -> str:
        """A fresh task id; in the partition of ``near`` (an id, or an idempotency
        claim's key) when given, so one script can touch both."""
        if near is None or self.partitions == 1:
            return uuid.uuid4().hex
        want = self.partition_of_key(near)
        while True:  # about `partitions` draws, each a microsecond
            candidate = uuid.uuid4().hex
            if self.partition_of(candidate) == want:
                return candidate

    def partition_of_key(self, key_or_id: str) -> int:
        """The partition of a key this space built (its tag), or of a task id."""
        if self.tagged and key_or_id.startswith(f"{self.root}:{{"):
            tag = key_or_id[len(self.root) + 2 : key_or_id.index("}", len(self.root))]
            return partition_tags(self.partitions).index(tag)
        return self.partition_of(key_or_id)

    @property
    def glob(self) -> KeySpace:
        """The key space of keys tied to no task (scanner lease, periodic entries,
        worker presence, the workflows index): one slot in a cluster."""
        if not self.tagged:
            return self
        return KeySpace(
            f"{self.root}:{{g}}", self.metrics, self.partitions, True, -1, self.root,
            self.ledger_ms,
        )  # fmt: skip

    def _whole(self, name: str) -> KeySpace:
        # A per-partition index asked of the whole store: which partition is meant?
        if self.tagged and self.partition is None:
            raise ValueError(f"{name} is kept per partition: ask it of keys.at(k) or keys.parts()")
        return self

    def _in(self, ident: str) -> str:
        # The prefix of the partition an id (or a claim's key material) lives in.
        return self.at(self.partition_of(ident)).prefix if self.tagged else self.prefix

    @property
    def layout(self) -> str:
        """The store's layout record (:mod:`.layout`): at a name no configuration
        changes, so a process configured for another layout finds it."""
        return f"{self.root}:layout"

    def layout_value(self) -> str:
        return f"{self.partitions}:{'tagged' if self.tagged else 'plain'}"

    @property
    def absent(self) -> str:
        """What a script gets for a key it does not need this call: '' unpartitioned;
        in a partition, a name in its slot (a cluster refuses a key of another slot),
        which no script writes (``_absent.lua``)."""
        return f"{self.prefix}:-" if self.tagged else ""

    # -- single keys -------------------------------------------------------------
    def task(self, task_id: str) -> str:
        return f"{self._in(task_id)}:t:{{{task_id}}}"

    def history(self, task_id: str) -> str:
        return f"{self._in(task_id)}:h:{{{task_id}}}"

    def result(self, task_id: str) -> str:
        return f"{self._in(task_id)}:r:{{{task_id}}}"

    def trail(self, task_id: str) -> str:
        # A committed task's hash and history, kept with its result when its spec
        # asks (django.tasks: a TaskResult shows arguments, attempts and times).
        return f"{self._in(task_id)}:tr:{{{task_id}}}"

    def chord(self, group_id: str) -> str:
        # A chord's state: its header's size ('size', set by the producer), each
        # member's result ('r:<index>', set by its commit) and 'fired' once the commit
        # that completed the header created the callback (docs/workflows.md).
        return f"{self._in(group_id)}:ch:{{{group_id}}}"

    def workflow(self, workflow_id: str) -> str:
        # A workflow's record: its kind and the tasks that make it up (store/workflows.py).
        return f"{self._in(workflow_id)}:wf:{{{workflow_id}}}"

    @property
    def workflows(self) -> str:
        # The newest workflows by creation time (ms), for the admin's overview.
        return f"{self.glob.prefix}:wfs"

    def idempotency(self, task_name: str, key: str) -> str:
        # Namespaced by the task's full dotted name: a.process(1) and b.process(1)
        # never share a claim. Hashed so any user string makes a bounded, safe key.
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{self._in(f'{task_name}:{digest}')}:i:{task_name}:{digest}"

    @property
    def _admission(self) -> str:
        # On a cluster the counters share one slot: admit.lua checks them together.
        return f"{self.root}:{{adm}}" if self.tagged else f"{self.root}:adm"

    @property
    def admission_all(self) -> str:
        return f"{self._admission}:all"

    def admission_task(self, task_name: str) -> str:
        return f"{self._admission}:t:{task_name}"

    @property
    def expiry(self) -> str:
        return f"{self._whole('expiry').prefix}:expiry"

    def debounce(self, task_name: str, key: str) -> str:
        # A debounced push's record: the id of the task its window waits for. Hashed
        # like an idempotency key; push.lua reads the task's own keys from it, so
        # unpartitioned stores only (as flow control).
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{self.prefix}:db:{task_name}:{digest}"

    @property
    def schedule(self) -> str:
        return f"{self._whole('schedule').prefix}:sched"

    @property
    def schedule_wake(self) -> str:
        return f"{self._whole('schedule_wake').prefix}:sched:wake"

    @property
    def dlq(self) -> str:
        return f"{self._whole('dlq').prefix}:dlq"

    def dlq_entry(self, entry_id: str) -> str:
        return f"{self._in(entry_id)}:dlq:e:{{{entry_id}}}"

    @property
    def dlq_lex(self) -> str:
        return f"{self._whole('dlq_lex').prefix}:dlq:x"

    @property
    def dlq_counts(self) -> str:
        return f"{self._whole('dlq_counts').prefix}:dlq:n"

    @property
    def leader(self) -> str:
        return f"{self.glob.prefix}:resurrector:leader"

    @property
    def periodic(self) -> str:
        # One field per beat_schedule entry (its name): the last tick handled.
        return f"{self.glob.prefix}:periodic"

    @property
    def periodic_claims(self) -> str:
        return f"{self.glob.prefix}:periodic:claims"

    def lock(self, name: str) -> str:
        return f"{self.root}:lock:{{{name}}}"

    def lock_token(self, name: str) -> str:
        # Same hash tag as the lock key: lock_acquire.lua reads both in one step.
        return f"{self.root}:lock:{{{name}}}:token"

    def lock_by(self, name: str) -> str:
        # Same hash tag: lock_acquire.lua answers a replay of its own call from it.
        return f"{self.root}:lock:{{{name}}}:by"

    def receipt(self, token: str) -> str:
        # The reply of a call whose own evidence is gone once it ran (a delete), kept
        # under the call's token so that its replay after a lost reply answers the same.
        return f"{self.prefix}:rcpt:{token}"

    def ratelimit(self, scope: str, key: str) -> str:
        # One fixed name per limiter: the window index lives inside the hash, because
        # only ratelimit.lua knows it (Redis TIME). The key (an IP, a user id, any
        # string a key function returns) is hashed like an idempotency key: bounded,
        # brace-free, not readable in clear. The scope is a code-given name.
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{self.root}:rl:{{{scope}:{digest}}}"

    # Flow control's keys (G14). The scripts build these names themselves, in
    # _limits.lua's limit_key, from the expiry index's prefix: a scope is only known
    # from the task's hash, inside the script. These methods name them for the readers
    # (observe/limits.py), and tests/unit/test_limits.py keeps the two spellings equal.
    # Unpartitioned stores only, as flow control is.
    def limit_run(self, scope: str) -> str:
        return f"{self.prefix}:lim:{scope}:run"

    def limit_ring(self, scope: str) -> str:
        return f"{self.prefix}:lim:{scope}:ring"

    def limit_parked(self, scope: str, key: str) -> str:
        return f"{self.prefix}:lim:{scope}:w:{key}"

    def limit_rate(self, scope: str) -> str:
        return f"{self.prefix}:lim:{scope}:tat"

    @property
    def limit_scopes(self) -> str:
        """Set: the scopes with slots held or tasks parked (_limits.lua keeps it)."""
        return f"{self.prefix}:lim_scopes"

    @property
    def limit_rates(self) -> str:
        """Zset: rate scope -> when its reservation expires, ms (_limits.lua)."""
        return f"{self.prefix}:lim_rates"

    def limit_pattern(self) -> str:
        """A SCAN pattern matching every flow-control key."""
        return f"{self.prefix}:lim:*"

    @property
    def ledger(self) -> str:
        # One stream per partition; the scripts name it from the expiry index's key
        # (_ledger.lua), so the two must stay side by side.
        return f"{self._whole('ledger').prefix}:ledger"

    # Hand-overs (store/handover.py): on a partitioned store a step's commit records
    # the tasks it brings about in its own partition; they are stored in theirs after.
    @property
    def handovers(self) -> str:
        return f"{self._whole('handovers').prefix}:ho"

    @property
    def handover_records(self) -> str:
        return f"{self._whole('handover_records').prefix}:ho:e"

    def handed(self, task_id: str) -> str:
        # A successor a hand-over stored, by the hand-over's token: a second completion
        # (a sweep racing the worker, a replay) finds it and stores nothing.
        return f"{self._in(task_id)}:hd:{{{task_id}}}"

    def for_commit_handing_over(
        self, task_id: str, idem_key: str | None, keep_trail: bool = False
    ) -> list[str]:
        """commit.lua's KEYS for a commit that records a hand-over (no successor, no
        callback created here): KEYS[14] and KEYS[15] the hand-over index and records."""
        p = self._with(task_id, idem_key)
        none = p.absent
        return [p.task(task_id), p.history(task_id), p.expiry, p.result(task_id),
                *p._counted(), idem_key or none, p.trail(task_id) if keep_trail else none,
                *[none] * 5, p.handovers, p.handover_records]  # fmt: skip

    def for_handover_store(self, task_id: str) -> list[str]:
        p = self.of_task(task_id)
        return [p.expiry, p.task(task_id), p.result(task_id), p.handed(task_id),
                p._counted()[0]]  # fmt: skip

    def for_chord_member(self, group_id: str) -> list[str]:
        p = self.of_task(group_id)
        return [p.chord(group_id), p.handovers, p.handover_records]

    def for_handover_done(self) -> list[str]:
        """handover_done.lua's KEYS, asked of the partition that holds the record."""
        return [self.handovers, self.handover_records]

    @property
    def metrics_counters(self) -> str:
        return f"{self._whole('metrics_counters').prefix}:m"

    @property
    def metrics_windows(self) -> str:
        return f"{self._whole('metrics_windows').prefix}:m:w"

    @property
    def workers(self) -> str:
        return f"{self.glob.prefix}:workers"

    @property
    def holders(self) -> str:
        # Every process that opened a liveness connection, until a scanner finds it dead:
        # a death is found even if no scanner listed the process while it lived.
        return f"{self.glob.prefix}:holders"

    @property
    def liveness_channel(self) -> str:
        # A pub/sub channel, not a key: liveness connections subscribe to it, and
        # nothing is ever published on it (store/liveness.py).
        return f"{self.glob.prefix}:alive"

    def _counted(self) -> list[str]:
        # The two metrics keys a counting script takes, '' for each when metrics are off.
        return [self.metrics_counters, self.metrics_windows] if self.metrics else [self.absent] * 2

    def all_pattern(self) -> str:
        """A SCAN pattern matching every key of this key space."""
        return f"{self.root}:*"

    def _pattern(self, kind: str) -> str:
        # Every partition's (and the global tag's) keys of one kind: Redis' glob
        # treats braces as plain characters.
        return f"{self.root}:{{*}}:{kind}" if self.tagged else f"{self.prefix}:{kind}"

    def expiring_patterns(self) -> tuple[str, ...]:
        """Patterns of the keys that live on after a task finished, each with a TTL
        (rate limiters' windows and admission counters too)."""
        return (
            self._pattern("r:*"),
            self._pattern("tr:*"),
            self._pattern("ch:*"),
            self._pattern("wf:*"),
            self._pattern("i:*"),
            f"{self.root}:rl:*",
            f"{self._admission}:*",
            self.lock_by("*"),
            self._pattern("rcpt:*"),
            self._pattern("lim:*:tat"),  # a rate's next emission time (_limits.lua)
            self._pattern("lim_rates"),  # expires with the last reservation
            self._pattern("db:*"),  # a debounce record left by a cancel (push.lua)
            self._pattern("ledger"),  # the delivery ledger: TTL one horizon (_ledger.lua)
            self._pattern("hd:*"),  # a hand-over's marker on its successor (handover_store.lua)
        )

    def owned_patterns(self) -> tuple[str, ...]:
        """Patterns of the keys an operator, a scanner or a lock holder owns: they
        outlive any task. Leases and locks carry a TTL; a lock's fencing counter has
        none by design (a token must never go back)."""
        return (
            self._pattern("dlq"), self._pattern("dlq:e:*"), self._pattern("dlq:x"),
            self._pattern("dlq:n"), self.leader, self.periodic, self.periodic_claims,
            self._pattern("sched:wake"),
            self.lock("*"), self.lock_token("*"),
            self._pattern("m"), self._pattern("m:w"), self.workers, self.holders,
            self.workflows,  # trimmed to the newest LISTED; each record expires
            self.layout,
        )  # fmt: skip

    # -- KEYS for each script, in the order of its header -------------------------
    # A script's keys all live in one partition: the task's. Batch scripts take the
    # ids of one partition (split them with by_partition).
    def by_partition(self, task_ids: Iterable[str]) -> dict[KeySpace, list[str]]:
        """``task_ids`` grouped by partition, each under its partition's key space."""
        groups: dict[KeySpace, list[str]] = {}
        for task_id in task_ids:
            groups.setdefault(self.of_task(task_id), []).append(task_id)
        return groups

    def _with(self, task_id: str, *others: str | None) -> KeySpace:
        # The task's partition; an idempotency claim or a successor it names must be in
        # it, or a cluster would refuse the script (the producer draws ids so they are).
        p = self.of_task(task_id)
        for other in others:
            if other and p.tagged and self.partition_of_key(other) != p.partition:
                raise ValueError(
                    f"{other!r} is not in task {task_id!r}'s partition: with PARTITIONS > 1 "
                    "a task's id, its idempotency claim and its workflow share a partition"
                )
        return p

    def for_push(
        self,
        task_id: str,
        idem_key: str | None,
        admission: Sequence[str] = (),
        queue_list: tuple[str, str] | None = None,
        debounce: str | None = None,
    ) -> list[str]:
        """``queue_list``: the broker's list and its doorbell (kombu's names, not ours)
        when push.lua queues the message itself. ``debounce``: a debounced push's
        record (:meth:`debounce`)."""
        p = self._with(task_id, idem_key)
        keys = [p.task(task_id), p.history(task_id), p.expiry, p.dlq_entry(task_id),
                p.result(task_id), p.schedule, p.schedule_wake, *p._counted(),
                *admission]  # fmt: skip
        if idem_key:
            keys.append(idem_key)
        if debounce:
            keys.append(debounce)
        return [*keys, *queue_list] if queue_list else keys

    def for_abort(self, task_id: str, idem_key: str | None) -> list[str]:
        p = self._with(task_id, idem_key)
        keys = [p.task(task_id), p.history(task_id), p.expiry, *p._counted()]
        return [*keys, idem_key] if idem_key else keys

    def for_adopt(self, task_id: str) -> list[str]:
        p = self.of_task(task_id)
        return [p.task(task_id), p.history(task_id), p.expiry, p.dlq_entry(task_id),
                p.result(task_id), *p._counted()]  # fmt: skip

    def for_start(self, task_id: str) -> list[str]:
        p = self.of_task(task_id)
        return [p.task(task_id), p.history(task_id), p.expiry, *p._counted()]

    def _one(self, task_ids: Iterable[str]) -> KeySpace:
        # A batch's partition: every id must be in it.
        task_ids = list(task_ids)
        p = self.of_task(task_ids[0]) if task_ids else self.at(0)
        if p.tagged and any(self.partition_of(t) != p.partition for t in task_ids):
            raise ValueError("a batch script takes the ids of one partition (by_partition)")
        return p

    def for_heartbeat(self, task_ids: Iterable[str]) -> list[str]:
        task_ids = list(task_ids)
        p = self._one(task_ids)
        return [p.expiry, *(p.task(t) for t in task_ids)]

    def for_handoff(self, task_ids: Iterable[str], histories: bool = False) -> list[str]:
        """The expiry index and each task's hash; their history lists too when the
        call brings a death (handoff.lua)."""
        task_ids = list(task_ids)
        keys = self.for_heartbeat(task_ids)
        if histories:
            p = self._one(task_ids)
            keys += [p.history(t) for t in task_ids]
        return keys

    def for_orphans(self, task_ids: Iterable[str]) -> list[str]:
        return self.for_heartbeat(task_ids)

    def for_take(self, queue_lists: Sequence[str], bells: Sequence[str]) -> list[str]:
        """take.lua's KEYS: the broker's queue lists and their doorbells (kombu's names,
        built by the transport), then the expiry index. Unpartitioned stores only: the
        script names the taken task's hash from the message (:meth:`task_key_parts`)."""
        if self.tagged:
            raise ValueError("take.lua runs on an unpartitioned store only")
        return [*queue_lists, *bells, self.expiry]

    def task_key_parts(self) -> tuple[str, str]:
        """The task hash key around its id, ``(before, after)``, for take.lua, which
        learns the id only from the message it takes (unpartitioned stores only)."""
        before, _, after = self.task("\0").partition("\0")
        return before, after

    def for_commit(
        self,
        task_id: str,
        idem_key: str | None,
        keep_trail: bool = False,
        successor: str | None = None,
        queue_list: tuple[str, str] | None = None,
        chord: str | None = None,
        links: Sequence[str] = (),
    ) -> list[str]:
        """``successor``: the id of the task this commit creates: a chain's next step,
        or (with ``chord``, the group id) a chord's callback, once the header is
        complete. ``queue_list``: the broker list its message is pushed to and that
        list's doorbell, when the script pushes it. ``links``: the ids of the callbacks
        (``link=``) it creates too."""
        p = self._with(task_id, idem_key, successor, chord, *links)
        none = p.absent
        keys = [p.task(task_id), p.history(task_id), p.expiry, p.result(task_id),
                *p._counted()]  # fmt: skip
        if links:
            trail = p.trail(task_id) if keep_trail else none
            nxt = [p.task(successor), p.result(successor)] if successor else [none, none]
            return [*keys, idem_key or none, trail, *nxt, *(queue_list or (none, none)),
                    p.chord(chord) if chord else none,
                    *(key for link in links for key in (p.task(link), p.result(link)))]  # fmt: skip
        if successor is not None:
            trail = p.trail(task_id) if keep_trail else none
            tail = [p.chord(chord)] if chord else []
            queued = queue_list or (none, none)
            return [*keys, idem_key or none, trail, p.task(successor), p.result(successor),
                    *queued, *tail]  # fmt: skip
        if keep_trail:
            return [*keys, idem_key or none, p.trail(task_id)]
        return [*keys, idem_key] if idem_key else keys

    def for_checkpoint(self, task_id: str) -> list[str]:
        return [self.task(task_id)]

    def for_progress(self, task_id: str) -> list[str]:
        return [self.task(task_id)]

    def for_retry(self, task_id: str) -> list[str]:
        p = self.of_task(task_id)
        return [p.task(task_id), p.history(task_id), p.expiry, p.schedule,
                p.schedule_wake, *p._counted()]  # fmt: skip

    def for_cancel(self, task_id: str, idem_key: str | None) -> list[str]:
        p = self._with(task_id, idem_key)
        keys = [p.task(task_id), p.history(task_id), p.expiry, p.schedule,
                p.result(task_id), *p._counted(), p.dlq, p.dlq_entry(task_id), p.dlq_lex,
                p.dlq_counts]  # fmt: skip
        return [*keys, idem_key] if idem_key else keys

    def for_schedule_take(self, task_ids: Iterable[str]) -> list[str]:
        task_ids = list(task_ids)
        p = self._one(task_ids)
        return [p.schedule, p.expiry, *(p.task(t) for t in task_ids), *p._counted()[:1]]

    def for_schedule_sent(self, task_ids: Iterable[str]) -> list[str]:
        task_ids = list(task_ids)
        p = self._one(task_ids)
        return [p.expiry, *(p.task(t) for t in task_ids)]

    def for_resurrect(self, task_ids: Iterable[str]) -> list[str]:
        task_ids = list(task_ids)
        """The expiry index, then each task's hash and history (a batch script)."""
        p = self._one(task_ids)
        keys = [p.expiry]
        for task_id in task_ids:
            keys += (p.task(task_id), p.history(task_id))
        return keys

    def for_resurrected(self, task_ids: Iterable[str]) -> list[str]:
        task_ids = list(task_ids)
        return [*self.for_resurrect(task_ids), *self._one(task_ids)._counted()]

    def for_leader(self) -> list[str]:
        return [self.leader]

    def for_presence(self) -> list[str]:
        return [self.workers]

    def for_tick(self) -> list[str]:
        return [self.periodic, self.periodic_claims]

    def for_tick_done(self) -> list[str]:
        return [self.periodic, self.periodic_claims]

    def for_lock_acquire(self, name: str) -> list[str]:
        return [self.lock(name), self.lock_token(name), self.lock_by(name)]

    def for_lock_extend(self, name: str) -> list[str]:
        return [self.lock(name)]

    def for_lock_release(self, name: str) -> list[str]:
        return [self.lock(name), self.lock_token(name)]

    def for_ratelimit(self, scope: str, key: str) -> list[str]:
        return [self.ratelimit(scope, key)]

    def _released(self, entry_id: str, task_id: str) -> list[str]:
        # The keys both halves of a release touch, in their headers' order.
        p = self._with(task_id, entry_id)
        return [
            p.dlq,
            p.dlq_entry(entry_id),
            p.task(task_id),
            p.history(task_id),
            p.expiry,
            p.dlq_lex,
            p.dlq_counts,
        ]

    def for_release(self, entry_id: str, task_id: str, idem_key: str | None) -> list[str]:
        keys = [*self._released(entry_id, task_id), self.result(task_id)]
        return [*keys, idem_key] if idem_key else keys

    def for_release_done(self, entry_id: str) -> list[str]:
        return [self.dlq_entry(entry_id), *self.of_task(entry_id)._counted()]

    def for_release_abort(self, entry_id: str, task_id: str, idem_key: str | None) -> list[str]:
        keys = self._released(entry_id, task_id)
        return [*keys, idem_key] if idem_key else keys

    def for_dead_letter(
        self, task_id: str, entry_id: str, idem_key: str | None, errbacks: Sequence[str] = ()
    ) -> list[str]:
        """``errbacks``: the ids of the errbacks (``link_error=``) the filing creates."""
        p = self._with(task_id, entry_id, idem_key, *errbacks)
        keys = [
            p.task(task_id),
            p.history(task_id),
            p.expiry,
            p.result(task_id),
            p.dlq,
            p.dlq_entry(entry_id),
            p.dlq_lex,
            p.dlq_counts,
            *p._counted(),
        ]
        if errbacks:
            return [*keys, idem_key or p.absent,
                    *(key for eb in errbacks for key in (p.task(eb), p.result(eb)))]  # fmt: skip
        return [*keys, idem_key] if idem_key else keys

    def for_dead_letter_handing_over(self, task_id: str, idem_key: str | None) -> list[str]:
        """dead_letter.lua's KEYS for a filing that records its errbacks as a hand-over
        (a partitioned store): KEYS[12] and KEYS[13] the hand-over index and records."""
        p = self._with(task_id, idem_key)
        return [*self.for_dead_letter(task_id, task_id, None), idem_key or p.absent,
                p.handovers, p.handover_records]  # fmt: skip

    def for_dlq_delete(
        self, entry_ids: Iterable[str], token: str, chords: Sequence[str | None] = ()
    ) -> list[str]:
        """``chords``: each entry's chord group id (its field 'chord'), None for none."""
        entry_ids = list(entry_ids)
        p = self._one(entry_ids)
        groups = list(chords) + [None] * (len(entry_ids) - len(chords))
        return [p.dlq, p.dlq_lex, p.dlq_counts, p.receipt(token),
                *(p.dlq_entry(e) for e in entry_ids),
                *(p.chord(g) if g else p.absent for g in groups)]  # fmt: skip
