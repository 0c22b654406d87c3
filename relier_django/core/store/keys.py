"""The whole Redis key schema. Nothing else in relier_django builds a key string.

Per-task keys share a ``{task_id}`` hash tag. Each script has one method here that
returns its KEYS in the order its ``.lua`` header declares.

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
| ``<p>:m``                   | hash   | metrics: counters, histogram buckets; no TTL, bounded   |
| ``<p>:m:w``                 | hash   | metrics: per-minute (120) and per-hour (80) ring slots  |
| ``<p>:workers``             | zset   | worker main process id -> liveness deadline (ms)        |
| ``<p>:holders``             | set    | ids of processes holding a liveness connection          |
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..model.config import Config


@dataclass(frozen=True, slots=True)
class KeySpace:
    prefix: str = "rl"
    # False (RELIER["METRICS"] = False): the scripts get '' for the metrics keys and
    # count nothing.
    metrics: bool = True

    @classmethod
    def of(cls, config: Config) -> KeySpace:
        """The key space a configuration names (its prefix, metrics on or off)."""
        return cls(config.key_prefix, config.metrics)

    # -- single keys -------------------------------------------------------------
    def task(self, task_id: str) -> str:
        return f"{self.prefix}:t:{{{task_id}}}"

    def history(self, task_id: str) -> str:
        return f"{self.prefix}:h:{{{task_id}}}"

    def result(self, task_id: str) -> str:
        return f"{self.prefix}:r:{{{task_id}}}"

    def trail(self, task_id: str) -> str:
        # A committed task's hash and history, kept with its result when its spec
        # asks (django.tasks: a TaskResult shows arguments, attempts and times).
        return f"{self.prefix}:tr:{{{task_id}}}"

    def chord(self, group_id: str) -> str:
        # A chord's state: its header's size ('size', set by the producer), each
        # member's result ('r:<index>', set by its commit) and 'fired' once the commit
        # that completed the header created the callback (docs/workflows.md).
        return f"{self.prefix}:ch:{{{group_id}}}"

    def workflow(self, workflow_id: str) -> str:
        # A workflow's record: its kind and the tasks that make it up (store/workflows.py).
        return f"{self.prefix}:wf:{{{workflow_id}}}"

    @property
    def workflows(self) -> str:
        # The newest workflows by creation time (ms), for the admin's overview.
        return f"{self.prefix}:wfs"

    def idempotency(self, task_name: str, key: str) -> str:
        # Namespaced by the task's full dotted name: a.process(1) and b.process(1)
        # never share a claim. Hashed so any user string makes a bounded, safe key.
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{self.prefix}:i:{task_name}:{digest}"

    @property
    def admission_all(self) -> str:
        return f"{self.prefix}:adm:all"

    def admission_task(self, task_name: str) -> str:
        return f"{self.prefix}:adm:t:{task_name}"

    @property
    def expiry(self) -> str:
        return f"{self.prefix}:expiry"

    @property
    def schedule(self) -> str:
        return f"{self.prefix}:sched"

    @property
    def schedule_wake(self) -> str:
        return f"{self.prefix}:sched:wake"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}:dlq"

    def dlq_entry(self, entry_id: str) -> str:
        return f"{self.prefix}:dlq:e:{{{entry_id}}}"

    @property
    def dlq_lex(self) -> str:
        return f"{self.prefix}:dlq:x"

    @property
    def dlq_counts(self) -> str:
        return f"{self.prefix}:dlq:n"

    @property
    def leader(self) -> str:
        return f"{self.prefix}:resurrector:leader"

    @property
    def periodic(self) -> str:
        # One field per beat_schedule entry (its name): the last tick handled.
        return f"{self.prefix}:periodic"

    @property
    def periodic_claims(self) -> str:
        return f"{self.prefix}:periodic:claims"

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{{{name}}}"

    def lock_token(self, name: str) -> str:
        # Same hash tag as the lock key: lock_acquire.lua reads both in one step.
        return f"{self.prefix}:lock:{{{name}}}:token"

    def lock_by(self, name: str) -> str:
        # Same hash tag: lock_acquire.lua answers a replay of its own call from it.
        return f"{self.prefix}:lock:{{{name}}}:by"

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
        return f"{self.prefix}:rl:{{{scope}:{digest}}}"

    @property
    def metrics_counters(self) -> str:
        return f"{self.prefix}:m"

    @property
    def metrics_windows(self) -> str:
        return f"{self.prefix}:m:w"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def holders(self) -> str:
        # Every process that opened a liveness connection, until a scanner finds it dead:
        # a death is found even if no scanner listed the process while it lived.
        return f"{self.prefix}:holders"

    @property
    def liveness_channel(self) -> str:
        # A pub/sub channel, not a key: liveness connections subscribe to it, and
        # nothing is ever published on it (store/liveness.py).
        return f"{self.prefix}:alive"

    def _counted(self) -> list[str]:
        # The two metrics keys a counting script takes, '' for each when metrics are off.
        return [self.metrics_counters, self.metrics_windows] if self.metrics else ["", ""]

    def all_pattern(self) -> str:
        """A SCAN pattern matching every key of this key space."""
        return f"{self.prefix}:*"

    def expiring_patterns(self) -> tuple[str, ...]:
        """Patterns of the keys that live on after a task finished, each with a TTL
        (rate limiters' windows and admission counters too)."""
        return (
            self.result("*"),
            self.trail("*"),
            self.chord("*"),
            self.workflow("*"),
            f"{self.prefix}:i:*",
            f"{self.prefix}:rl:*",
            f"{self.prefix}:adm:*",
            self.lock_by("*"),
            self.receipt("*"),
        )

    def owned_patterns(self) -> tuple[str, ...]:
        """Patterns of the keys an operator, a scanner or a lock holder owns: they
        outlive any task. Leases and locks carry a TTL; a lock's fencing counter has
        none by design (a token must never go back)."""
        return (
            self.dlq, self.dlq_entry("*"), self.dlq_lex, self.dlq_counts, self.leader,
            self.periodic, self.periodic_claims,
            self.schedule_wake,
            self.lock("*"), self.lock_token("*"),
            self.metrics_counters, self.metrics_windows, self.workers, self.holders,
            self.workflows,  # trimmed to the newest LISTED; each record expires
        )  # fmt: skip

    # -- KEYS for each script, in the order of its header -------------------------
    def for_push(
        self,
        task_id: str,
        idem_key: str | None,
        admission: Sequence[str] = (),
        queue_list: str | None = None,
    ) -> list[str]:
        """``queue_list``: the broker's list (kombu's name, not ours) when push.lua queues
        the message itself."""
        keys = [self.task(task_id), self.history(task_id), self.expiry, self.dlq_entry(task_id),
                self.result(task_id), self.schedule, self.schedule_wake, *self._counted(),
                *admission]  # fmt: skip
        if idem_key:
            keys.append(idem_key)
        return [*keys, queue_list] if queue_list else keys

    def for_abort(self, task_id: str, idem_key: str | None) -> list[str]:
        keys = [self.task(task_id), self.history(task_id), self.expiry, *self._counted()]
        return [*keys, idem_key] if idem_key else keys

    def for_start(self, task_id: str) -> list[str]:
        return [self.task(task_id), self.history(task_id), self.expiry, *self._counted()]

    def for_heartbeat(self, task_ids: list[str]) -> list[str]:
        return [self.expiry, *(self.task(t) for t in task_ids)]

    def for_handoff(self, task_ids: list[str]) -> list[str]:
        return self.for_heartbeat(task_ids)

    def for_orphans(self, task_ids: list[str]) -> list[str]:
        return self.for_heartbeat(task_ids)

    def for_commit(
        self,
        task_id: str,
        idem_key: str | None,
        keep_trail: bool = False,
        successor: str | None = None,
        queue_list: str | None = None,
        chord: str | None = None,
    ) -> list[str]:
        """``successor``: the id of the task this commit creates: a chain's next step,
        or (with ``chord``, the group id) a chord's callback, once the header is
        complete. ``queue_list``: the broker list its message is pushed to, when the
        script pushes it."""
        keys = [self.task(task_id), self.history(task_id), self.expiry, self.result(task_id),
                *self._counted()]  # fmt: skip
        if successor is not None:
            trail = self.trail(task_id) if keep_trail else ""
            tail = [self.chord(chord)] if chord else []
            return [*keys, idem_key or "", trail, self.task(successor), self.result(successor),
                    queue_list or "", *tail]  # fmt: skip
        if keep_trail:
            return [*keys, idem_key or "", self.trail(task_id)]
        return [*keys, idem_key] if idem_key else keys

    def for_checkpoint(self, task_id: str) -> list[str]:
        return [self.task(task_id)]

    def for_retry(self, task_id: str) -> list[str]:
        return [self.task(task_id), self.history(task_id), self.expiry, self.schedule,
                self.schedule_wake, *self._counted()]  # fmt: skip

    def for_cancel(self, task_id: str, idem_key: str | None) -> list[str]:
        keys = [self.task(task_id), self.history(task_id), self.expiry, self.schedule,
                self.result(task_id), *self._counted()]  # fmt: skip
        return [*keys, idem_key] if idem_key else keys

    def for_schedule_take(self, task_ids: Iterable[str]) -> list[str]:
        return [self.schedule, self.expiry, *(self.task(t) for t in task_ids)]

    def for_schedule_sent(self, task_ids: Iterable[str]) -> list[str]:
        return [self.expiry, *(self.task(t) for t in task_ids)]

    def for_resurrect(self, task_ids: Iterable[str]) -> list[str]:
        """The expiry index, then each task's hash and history (a batch script)."""
        keys = [self.expiry]
        for task_id in task_ids:
            keys += (self.task(task_id), self.history(task_id))
        return keys

    def for_resurrected(self, task_ids: Iterable[str]) -> list[str]:
        return [*self.for_resurrect(task_ids), *self._counted()]

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
        return [
            self.dlq,
            self.dlq_entry(entry_id),
            self.task(task_id),
            self.history(task_id),
            self.expiry,
            self.dlq_lex,
            self.dlq_counts,
        ]

    def for_release(self, entry_id: str, task_id: str, idem_key: str | None) -> list[str]:
        keys = [*self._released(entry_id, task_id), self.result(task_id)]
        return [*keys, idem_key] if idem_key else keys

    def for_release_done(self, entry_id: str) -> list[str]:
        return [self.dlq_entry(entry_id), *self._counted()]

    def for_release_abort(self, entry_id: str, task_id: str, idem_key: str | None) -> list[str]:
        keys = self._released(entry_id, task_id)
        return [*keys, idem_key] if idem_key else keys

    def for_dead_letter(self, task_id: str, entry_id: str, idem_key: str | None) -> list[str]:
        keys = [
            self.task(task_id),
            self.history(task_id),
            self.expiry,
            self.result(task_id),
            self.dlq,
            self.dlq_entry(entry_id),
            self.dlq_lex,
            self.dlq_counts,
            *self._counted(),
        ]
        return [*keys, idem_key] if idem_key else keys

    def for_dlq_delete(self, entry_ids: list[str], token: str) -> list[str]:
        return [self.dlq, self.dlq_lex, self.dlq_counts, self.receipt(token),
                *(self.dlq_entry(e) for e in entry_ids)]  # fmt: skip
