"""The push pipeline: validate arguments, build the envelope, store it (and claim the
idempotency key) in one script, and queue it: in that same script when the broker is
kombu's Redis transport on the store's server and database, else by a publish after.

``push`` is for sync code, ``apush`` for async code; both share ``prepare`` and make
the same calls: one Redis round trip (push.lua), plus the broker publish if the
broker is elsewhere.

Inside a database transaction a push is validated at once, but stored and sent only
when the transaction commits (``aftercommit.deliver``), so a rollback leaves nothing
behind. The core cannot see Django's transactions: the Django layer installs a
:data:`TransactionHook` with :func:`set_transaction_hook` (docs/transactions.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions
from celery import current_task
from kombu.exceptions import OperationalError

from .. import crashpoint
from ..broker import publish
from ..model import arguments, config, events, ids, limits, resurrections, tracing, workflow
from ..model.envelope import Envelope, decode
from ..model.errors import AdmissionRejected, ConfigError, DuplicateTaskId, PushFailed
from ..model.idem_key import derive_key
from ..model.spec import TaskSpec
from ..model.timing import NOW, Debounce, Timing
from ..store import chords, event_loop, layout, workflows
from ..store.connection import async_client, sync_client, target
from ..store.keys import KeySpace
from ..store.receipt import Receipt
from ..store.scripts import ScriptCall
from . import admission, aftercommit, eager, idempotency

logger = logging.getLogger("relier_django.producer")

TransactionHook = Callable[[str | None, Callable[[], None]], bool]
"""``hook(using, callback)``: if a transaction is open on database alias ``using``
(``None``: the default one) in this thread, arrange for ``callback()`` to run once
it commits (never, if it rolls back) and return True; otherwise return False and
leave ``callback`` alone. Raises for an unknown alias."""

OutboxHook = Callable[[str | None, Envelope, str, Timing], Callable[[], None] | None]
"""``hook(using, env, encoded, when)``: write the push into the outbox of the
transaction open on ``using``, and return how to delete that row once the push is
stored and queued; ``None`` when the outbox is off (the push is sent as before).
Raises when the row cannot be written (the transaction then rolls back)."""

_hook_lock = threading.Lock()
_transaction_hook: TransactionHook | None = None
_outbox_hook: OutboxHook | None = None


def set_transaction_hook(hook: TransactionHook | None) -> None:
    """Install how ``push`` finds an open transaction (the Django layer does, in
    ``AppConfig.ready()``); ``None`` uninstalls it: every push is then sent at once."""
    global _transaction_hook
    with _hook_lock:
        _transaction_hook = hook


def set_outbox_hook(hook: OutboxHook | None) -> None:
    """Install the transactional outbox (the Django layer does, in ``AppConfig.ready()``);
    ``None`` uninstalls it: a deferred push then exists only in memory until its
    commit's callback sends it."""
    global _outbox_hook
    with _hook_lock:
        _outbox_hook = hook


def prepare(
    spec: TaskSpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    task_id: str | None = None,
    queue: str | None = None,
    idempotency_key: str | None = None,
    chain: Sequence[workflow.Step] = (),
    group_id: str | None = None,
    chord: Mapping[str, Any] | None = None,
    link: Sequence[workflow.Step] = (),
    link_error: Sequence[workflow.Step] = (),
    priority: int | None = None,
    flow: tuple[str | None, str | None] = (None, None),
) -> Envelope:
    """Validate the call and build its first envelope (fence 1). Raises ``TypeError``
    for arguments that do not fit the signature or are not JSON-serialisable, and
    ``InvalidTaskId`` (a ``ValueError``) for a ``task_id`` or ``group_id`` that breaks
    the id rule (``model.ids``).
    ``idempotency_key``: this push's own key (a periodic tick's), whatever the task's.
    ``chain``: the steps that follow this task (it is then a workflow's first step).
    ``group_id``: the group this task is a member of (the workflow's identity).
    ``chord``: a chord header member's place (group id, index, callback step).
    ``link``, ``link_error``: the callbacks its commit creates, the errbacks its filing
    in the DLQ creates (Celery's ``link=``, ``link_error=``).
    ``priority``: this push's priority (0..9, checked by the caller), else the task's.
    ``flow``: this push's own named limit and key (``limits.check_call``), else the task's.

    A workflow's member (a chain's first step, a group's or a chord header's member)
    claims no idempotency key, whatever its task says: it is identified by the id
    Celery froze for it, which its workflow and the caller's ``AsyncResult`` wait on.
    Deduplicated onto another task, that id would never run, and the chain's rest, the
    chord's callback or ``group.get()`` would wait for ever (docs/workflows.md)."""
    arguments.check(spec, args, kwargs)
    if group_id is not None:
        ids.check_id(group_id, "group_id")
    idem = idempotency_key
    member = bool(chain or chord or group_id)
    if idem is None and spec.idempotent and not member:
        idem = derive_key(spec.idempotency_key, args, kwargs)
    _flat_when_partitioned(spec.name, chain, chord, link)
    task_id = _placed(spec.name, task_id, idem)
    return Envelope(
        id=task_id,
        workflow=group_id or (task_id if chain or any(s.chord for s in link) else ""),
        chain=workflow.chain_of(chain),
        chord=dict(chord or {}),
        link=workflow.chain_of(link),
        link_error=workflow.chain_of(link_error),
        task=spec.name,
        args=tuple(args),
        kwargs=dict(kwargs),
        queue=queue or spec.queue or "",
        priority=priority if priority is not None else spec.priority,
        limit=flow[0],
        limit_key=flow[1],
        idem_key=idem,
        created_ms=int(time.time() * 1000),
        schema_version=spec.schema.version,
        trace=tracing.inject(),  # the push span's context, when one is in progress
        parent=_pushing_task(),
        push=secrets.token_hex(8),  # 64 random bits: this push's token (Envelope.identity)
    )


def _placed(task: str, task_id: str | None, idem: str | None) -> str:
    """The task's id: the caller's, or a fresh one. With partitions (docs/scaling.md),
    a fresh id is drawn in the partition of the task's idempotency claim, so that one
    script stores both; a caller's id must already be there. A workflow's task (a
    chain's step, a chord's member, one with ``link=`` or ``link_error=``) is placed as
    any task: its commit (its filing in the DLQ) hands what follows over to that task's
    partition (store/handover.py).

    Raises:
        InvalidTaskId: a caller's id that breaks the id rule (``model.ids``).
        ValueError: with partitions, a caller's id whose partition is not its claim's.
    """
    if task_id is not None:
        ids.check_id(task_id)
    keys = KeySpace.of(config.current())
    if not keys.tagged:
        return task_id or uuid.uuid4().hex
    claim = keys.idempotency(task, idem) if idem is not None else None
    if task_id is None:
        return keys.new_id(near=claim)
    if claim is not None and keys.partition_of_key(claim) != keys.partition_of(task_id):
        raise ValueError(
            f"{task}: task_id {task_id!r} and the task's idempotency key fall in different "
            "partitions of the store, which one script cannot touch together on a Redis "
            "Cluster; leave task_id out and relier draws one in the key's partition "
            "(docs/scaling.md)"
        )
    return task_id


def _flat_when_partitioned(
    task: str,
    chain: Sequence[Any] | None,
    chord: Mapping[str, Any] | None,
    link: Sequence[Any] | None,
) -> None:
    """A nested canvas (a chain inside a chord's header, a group inside or ending a
    chain) is refused on a partitioned store, where the hand-over (store/handover.py)
    carries flat chains, chords and links only: not built there yet."""
    steps = list(chain or ())
    nested = bool(chord and steps) or any(
        getattr(s, "chord", None) or getattr(s, "link", None) or getattr(s, "chain", None)
        for s in (*steps, *(link or ()))
    )
    if nested and KeySpace.of(config.current()).tagged:
        raise TypeError(
            f"{task}: a chain inside a chord's header, or a group inside or at the end of a "
            "chain, is not supported on a partitioned store yet (PARTITIONS > 1 or CLUSTER): "
            "flat chains, chords and links are (docs/workflows.md)"
        )


@dataclass(frozen=True, slots=True)
class _Push:
    """One push in progress: what both ``push`` and ``apush`` compute before I/O."""

    cfg: config.Config
    spec: TaskSpec
    env: Envelope
    encoded: str
    keys: KeySpace
    # Names this push call in push.lua and abort.lua; every try of the call (a
    # client retry, an on-commit retry) reuses it.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    when: Timing = NOW  # countdown / eta / expires: stored to wait in the schedule index
    # A workflow's record (the tasks it names), written when this push is sent, so a
    # rolled-back transaction leaves none.
    record: workflows.Record | None = None
    # Flow control: the slots and rate this push goes through (None: none apply).
    gate: limits.Gate | None = None
    # A debounced push's record key (KeySpace.debounce); None: not debounced.
    debounce: str | None = None

    @classmethod
    def begin(
        cls,
        spec: TaskSpec,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        task_id: str | None,
        queue: str | None = None,
        when: Timing = NOW,
        idempotency_key: str | None = None,
        chain: Sequence[workflow.Step] = (),
        group_id: str | None = None,
        chord: Mapping[str, Any] | None = None,
        position: int | None = None,
        link: Sequence[workflow.Step] = (),
        link_error: Sequence[workflow.Step] = (),
        debounce: Debounce | None = None,
        priority: int | None = None,
        flow: tuple[str | None, str | None] = (None, None),
    ) -> _Push:
        cfg = config.current()
        env = prepare(spec, args, kwargs, task_id, queue, idempotency_key, chain, group_id, chord,
                      link, link_error, priority, flow)  # fmt: skip
        env = _expiring(env, when)
        encoded = env.encode(cfg.signer)
        arguments.check_size(spec, args, kwargs, encoded, cfg.arguments_max_bytes)
        record = _record_of(env, position)
        keys = KeySpace.of(cfg)
        gate = gate_for(cfg, spec, env, keys)
        record_key = _debounced(spec, keys, args, kwargs, debounce)
        return cls(cfg, spec, env, encoded, keys, when=when, record=record, gate=gate,
                   debounce=record_key)  # fmt: skip

    def store(self, message: publish.Queued | None) -> ScriptCall[idempotency.StoreResult]:
        grace_ms = int(self.cfg.queued_grace_s * 1000)
        limit = resurrections.stored(self.spec.max_resurrections, self.cfg.resurrection_policy())
        # On a Redis Cluster the counters are not in the task's slot: admit() runs them.
        gates = () if self.cfg.cluster else self._limits()
        return idempotency.store(
            self.keys, self.env, self.encoded, grace_ms, limit, gates, message,
            token=self.token, when=self.when, gate=self.gate,
            debounce=(self.debounce, self.cfg.result_ttl_s * 1000) if self.debounce else None,
        )  # fmt: skip

    def _limits(self) -> tuple[admission.Limit, ...]:
        return admission.limits(self.keys, self.cfg, self.spec.name, self.spec.admission_limit)

    def admission_apart(self) -> ScriptCall[admission.Admission] | None:
        """On a Redis Cluster, the admission check as a call of its own, made before
        the store (None when no limit applies, or off a cluster, where push.lua admits
        in the same step). Unlike push.lua's, it also counts a push that then turns out
        to be an idempotent duplicate, or that fails: it errs towards refusing."""
        if not self.cfg.cluster:
            return None
        limits = self._limits()
        return admission.check(limits) if limits else None

    def refused(self, verdict: admission.Admission) -> None:
        """Raise AdmissionRejected for a refused :meth:`admission_apart`."""
        if not verdict.admitted:
            self.duplicate(idempotency.StoreResult(False, "", refused_for_s=verdict.retry_after_s))

    def duplicate(self, stored: idempotency.StoreResult) -> Receipt | None:
        """The receipt of an idempotent duplicate, or None when this push was stored."""
        if stored.refused_for_s > 0:
            logger.warning(
                "push refused by admission control task=%s retry_after_s=%.3f",
                self.env.task,
                stored.refused_for_s,
            )
            raise AdmissionRejected(self.env.task, stored.refused_for_s)
        if stored.id_taken:
            raise DuplicateTaskId(f"a task with id {self.env.id!r} already exists")
        if stored.id_finished:
            raise DuplicateTaskId(
                f"task id {self.env.id!r} has already run to an outcome, which is kept for "
                "RESULT_TTL_S; read it with relier_django.result(task_id).get(), or push with "
                "another id"
            )
        if stored.id_in_dlq:
            raise DuplicateTaskId(
                f"task id {self.env.id!r} names an entry in the dead-letter queue; release it "
                f"(`manage.py relier_dlq release {self.env.id}`) or delete it, or push with "
                "another id"
            )
        if stored.stored:
            return None
        logger.debug("idempotent duplicate task=%s task_id=%s", self.env.task, stored.task_id)
        return Receipt(stored.task_id, deduplicated=True, config=self.cfg)

    def told_parked(self, stored: idempotency.StoreResult) -> None:
        """Emit ``TaskParked`` when push.lua parked this push over its limit (G14)."""
        if stored.parked and self.gate is not None:
            events.emit(events.TaskParked(self.env.id, self.env.task, self.gate.scope,
                                          self.gate.parked_key))  # fmt: skip

    def receipt(self) -> Receipt:
        return Receipt(
            self.env.id, deduplicated=False, config=self.cfg, created_ms=self.env.created_ms
        )

    def send_now(self, app: Any, client: Any) -> Receipt:
        """Store and queue in one step (push.lua), when the broker is kombu's Redis
        transport on the store's server and database; otherwise store, then publish,
        and undo the store if the publish fails.

        Raises:
            AdmissionRejected, DuplicateTaskId: push.lua refused it; nothing stored.
            Redis or broker errors: nothing remains (unless the undo failed too: then
                the stored copy is re-dispatched after ``QUEUED_GRACE_S``).
        """
        # A delayed push waits in the schedule index: no message now (the scanner
        # leader publishes it when due).
        message = (
            None
            if self.when.delayed or self.gate is not None
            else publish.message_for_store(app, self.env, self.encoded, client)
        )
        layout.verify(client, self.keys, target(self.cfg))
        if (check := self.admission_apart()) is not None:
            self.refused(check.run(client))
        if self.record is not None:
            self.record.run(client, self.keys)
        stored = self.store(message).run(client)
        if (dup := self.duplicate(stored)) is not None:
            return dup
        self.told_parked(stored)
        if message is None and not stored.scheduled:
            try:
                publish.send(app, self.env, self.encoded)
            except BaseException:
                idempotency.abort(self.keys, self.env, self.token).run(client)
                raise
        # The header's last member stored: its state outlives waits (on a partitioned
        # store it keeps its TTL: docs/workflows.md#on-a-partitioned-store).
        if self.env.chord and not self.keys.tagged:
            chords.seal(client, self.keys, str(self.env.chord["id"]), int(self.env.chord["index"]))
        return self.receipt()

    async def asend_now(self, app: Any, client: Any) -> Receipt:
        """:meth:`send_now` for async code."""
        message = None
        if not self.when.delayed and self.gate is None:
            message = await publish.amessage_for_store(app, self.env, self.encoded, client)
        await layout.averify(client, self.keys, target(self.cfg))
        if (check := self.admission_apart()) is not None:
            self.refused(await check.arun(client))
        if self.record is not None:
            await self.record.arun(client, self.keys)
        stored = await self.store(message).arun(client)
        if (dup := self.duplicate(stored)) is not None:
            return dup
        self.told_parked(stored)
        if message is None and not stored.scheduled:
            try:
                await publish.asend(app, self.env, self.encoded)
            except BaseException:
                await idempotency.abort(self.keys, self.env, self.token).arun(client)
                raise
        return self.receipt()

    def defer(self, app: Any, using: str | None) -> Receipt | None:
        """Leave the store and the send to the commit of the transaction open on
        ``using``; None when none is open (the caller sends now)."""
        hook = _transaction_hook
        if hook is None:
            if using is not None:
                raise RuntimeError(
                    f"{self.spec.name}: push with using={using!r} needs the transaction "
                    "hook of the Django layer: add 'relier_django' to INSTALLED_APPS"
                )
            return None
        receipt = Receipt.deferred(self.env.id, self.cfg, self.env.created_ms)
        held: list[Callable[[], None]] = []  # the outbox row's delete, once written
        if not hook(using, functools.partial(aftercommit.deliver, self, app, receipt, held)):
            return None
        # Written after the callback is registered, in the same transaction: the
        # callback runs only at its commit, when the row is committed with it.
        if _outbox_hook is not None and (
            delete := _outbox_hook(using, self.env, self.encoded, self.when)
        ):
            held.append(delete)
        logger.debug(
            "push deferred to commit task=%s task_id=%s using=%s", self.env.task, self.env.id, using
        )
        return receipt


def gate_for(
    cfg: config.Config, spec: TaskSpec, env: Envelope, keys: KeySpace
) -> limits.Gate | None:
    """The gate a push of ``env`` goes through (its task's flow control, or the push's
    own ``limit=`` and key); None when none applies. A relayed outbox row and a
    replayed envelope go through it as the push they repeat.

    Raises:
        ConfigError: a limit the settings lack, or flow control on a partitioned store.
        ValueError: a key that is not one (``limits.gate_of``).
    """
    gate = limits.gate_of(spec.name, spec.limits, cfg.named_limits(), spec.user_signature(),
                          env.args, env.kwargs, env.limit, env.limit_key)  # fmt: skip
    if gate is not None and keys.tagged:
        raise ConfigError(
            f"{spec.name}: flow control (concurrency=, limit=, rate=) needs an "
            "unpartitioned store (PARTITIONS = 1, no CLUSTER): a freed slot is handed "
            "to the next task in the same step, which one server does (docs/flow-control.md)"
        )
    return gate


def _debounced(
    spec: TaskSpec,
    keys: KeySpace,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    debounce: Debounce | None,
) -> str | None:
    """A debounced push's record key (None: not debounced): its ``debounce_key``, else
    its arguments, under the task's name.

    Raises:
        ConfigError: a partitioned store (push.lua reaches the superseded task's keys
            from the record, which one server does).
        ValueError: an idempotent task: a second push of the same arguments would be
            its first's duplicate, never superseding it.
    """
    if debounce is None:
        return None
    if keys.tagged:
        raise ConfigError(
            f"{spec.name}: debounce_s= needs an unpartitioned store (PARTITIONS = 1, no "
            "CLUSTER): a push supersedes the task its window waits for in one step, which "
            "one server does (docs/flow-control.md)"
        )
    if spec.idempotent:
        raise ValueError(
            f"{spec.name} is idempotent: a push with the same arguments is the first one's "
            "duplicate and supersedes nothing; debounce a task that is not idempotent "
            "(docs/flow-control.md)"
        )
    key = debounce.key if debounce.key is not None else derive_key(None, args, kwargs)
    return keys.debounce(spec.name, key)


def _pushing_task() -> str:
    """The id of the task whose body is pushing (Celery's ``parent_id`` for what it
    pushes), or "" outside a task's run (a direct call of the body is not a run)."""
    task = current_task
    request = getattr(task, "request", None) if task else None
    if request is None or request.called_directly or not request.id:
        return ""
    return str(request.id)


def _expiring(env: Envelope, when: Timing) -> Envelope:
    """``env`` with its expiry (``expires=``) as an epoch time on the producer's clock,
    for ``self.request.expires``; the store refuses a late start on its own clock."""
    if when.expires_at_ms is not None:
        return dataclasses.replace(env, expires_ms=when.expires_at_ms)
    if when.expires_in_ms is not None:
        return dataclasses.replace(env, expires_ms=env.created_ms + when.expires_in_ms)
    return env


def _record_of(env: Envelope, position: int | None) -> workflows.Record | None:
    """What this push adds to its workflow's record (None: it is in no workflow)."""
    if env.chord:
        callback = env.chord["callback"]
        index = int(env.chord["index"])
        members: list[tuple[int | str, str, str]] = [(index, env.id, env.task)]
        if env.chain:  # a chain in the header: each of its steps at its place, in order
            steps = [(env.id, env.task), *((s["id"], s["task"]) for s in env.chain)]
            members = [(f"{index}.{k}", task_id, task) for k, (task_id, task) in enumerate(steps)]
        return workflows.Record(
            str(env.chord["id"]), "chord", env.created_ms, members,
            (callback["id"], callback["task"]),
        )  # fmt: skip
    if env.workflow and env.workflow != env.id:  # a group's member (or a chain in one)
        return workflows.Record(
            env.workflow, "group", env.created_ms, [(position or 0, env.id, env.task)]
        )
    opening = [raw for raw in env.link if raw.get("chord")]  # a chord right after it
    if env.chain or opening:
        tasks = workflow.planned([*opening, *env.chain])
        later = [(i, task_id, task) for i, (task_id, task) in enumerate(tasks, start=1)]
        return workflows.Record(env.id, "chain", env.created_ms, [(0, env.id, env.task), *later])
    return None


def push(
    spec: TaskSpec,
    app: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    task_id: str | None = None,
    queue: str | None = None,
    when: Timing = NOW,
    idempotency_key: str | None = None,
    on_commit: bool = True,
    using: str | None = None,
    chain: Sequence[workflow.Step] = (),
    group_id: str | None = None,
    chord: Mapping[str, Any] | None = None,
    position: int | None = None,
    link: Sequence[workflow.Step] = (),
    link_error: Sequence[workflow.Step] = (),
    debounce: Debounce | None = None,
    priority: int | None = None,
    flow: tuple[str | None, str | None] = (None, None),
) -> Receipt:
    """Sync push. See ``RelierTask.push`` and ``RelierTask.push_with`` for the guarantees.
    ``chain``: the steps that follow, each created by the commit of the one before.
    ``group_id``: the Celery group this push is a member of; ``chord``: its place in a
    chord's header (the commit that completes the header creates the callback);
    ``position``: its place in the group (for the workflow's record); ``link``,
    ``link_error``: its callbacks and errbacks (see :func:`prepare`); ``debounce``: a
    debounced push (``when`` is then its window as a countdown); ``priority``: 0..9, 9
    taken first (checked by the caller; default the task's); ``flow``: the push's own
    named limit and key (``limits.check_call``; default the task's)."""
    if event_loop.in_running_loop():
        raise RuntimeError(
            f"{spec.name}.push() was called inside a running event loop, where it would "
            f"block; use `await {spec.name.rsplit('.', 1)[-1]}.apush(...)` instead"
        )
    with tracing.push_span(spec.name):
        # Validation comes first, inside the caller's transaction: bad input raises now.
        p = _Push.begin(
            spec, args, kwargs, task_id, queue, when, idempotency_key, chain, group_id, chord,
            position, link, link_error, debounce, priority, flow,
        )  # fmt: skip
        tracing.annotate(p.env)
        # Eager mode or a test's capture_pushes(): run here or record, never Redis (eager.py).
        hook = _transaction_hook if on_commit else None
        if (diverted := eager.divert(spec, app, p.env, p.cfg, hook, using)) is not None:
            return diverted
        if on_commit and (deferred := p.defer(app, using)) is not None:
            crashpoint.cross(crashpoint.PUSH, "", spec.name)
            return deferred
        try:
            sent = p.send_now(app, sync_client(p.cfg, wait_s=waits_for(p.cfg)))
        except UNREACHABLE as exc:
            raise _failed(p, exc) from exc
        crashpoint.cross(crashpoint.PUSH, "", spec.name)
        return sent


async def apush(
    spec: TaskSpec,
    app: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    task_id: str | None = None,
    queue: str | None = None,
    when: Timing = NOW,
    idempotency_key: str | None = None,
    on_commit: bool = True,
    using: str | None = None,
    debounce: Debounce | None = None,
    priority: int | None = None,
    flow: tuple[str | None, str | None] = (None, None),
) -> Receipt:
    """Async push: the same steps as :func:`push`, without blocking the event loop.

    It asks the hook like :func:`push` does (a flag read, no I/O: safe in a running
    loop), and so waits only for a transaction of its own async context. Django gives
    async code database connections of its own and refuses ``atomic()`` there (unless
    ``DJANGO_ALLOW_ASYNC_UNSAFE``), so in practice an ``apush`` sends at once: a
    transaction in sync code (a ``sync_to_async`` function, the thread that called
    ``asyncio.run``) is not the coroutine's, and ``push()`` in that sync code is the
    call that waits for it.
    """
    with tracing.push_span(spec.name):
        p = _Push.begin(spec, args, kwargs, task_id, queue, when, idempotency_key,
                        debounce=debounce, priority=priority, flow=flow)  # fmt: skip
        tracing.annotate(p.env)
        hook = _transaction_hook if on_commit else None
        if (diverted := await eager.adivert(spec, app, p.env, p.cfg, hook, using)) is not None:
            return diverted
        if on_commit and (deferred := p.defer(app, using)) is not None:
            crashpoint.cross(crashpoint.PUSH, "", spec.name)
            return deferred
        try:
            sent = await p.asend_now(app, async_client(p.cfg, wait_s=waits_for(p.cfg)))
        except UNREACHABLE as exc:
            raise _failed(p, exc) from exc
        crashpoint.cross(crashpoint.PUSH, "", spec.name)
        return sent


def waits_for(cfg: config.Config) -> float | None:
    """How long a push sent at once waits for Redis: ``PUSH_WAIT_S`` for a caller that
    is waiting (a request, a script, the scanner's periodic ticks, retried at its next
    pass); None, the workers' ``REDIS_RETRY_S``, for a push made by a running task,
    which no request waits on and which must ride out a failover as the task's own
    calls do, rather than fail the task."""
    return None if current_task else cfg.push_wait_s


UNREACHABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OperationalError,  # kombu's: the broker, when it is not the store's server
    OSError,
)
"""What a push sent at once raises when Redis or the broker cannot be reached (after
the client's own retries): :func:`push` turns each into ``PushFailed``."""


def _failed(p: _Push, exc: BaseException) -> PushFailed:
    return PushFailed(
        f"{p.spec.name}: the push of task {p.env.id} could not reach relier's Redis or "
        f"Celery's broker ({type(exc).__name__}: {exc}). The task was not stored, so it "
        "will not run: push again, or answer the request with an error (e.g. HTTP 503). "
        "(In the rare case the store succeeded and only the publish and its undo failed, "
        f"the stored task runs once after QUEUED_GRACE_S ({p.cfg.queued_grace_s:g} s), "
        "and a push again with the same task_id raises DuplicateTaskId.)"
    )


@dataclass(frozen=True, slots=True)
class PushWith:
    """``task.push_with(on_commit=..., using=..., countdown=..., eta=..., expires=...)``:
    options for one push, kept apart from the task's own arguments so that no task
    parameter name is ever reserved.

    Attributes:
        on_commit: inside a transaction, wait for its commit (the default); False
            sends at once, even inside one.
        using: the database alias whose transaction to wait for; ``None`` is Django's
            default database.
        when: the countdown, eta and expiry (see ``model.timing.timing``).
        debounce: a debounced push (``model.timing.debounce``); ``when`` then holds its
            window as the countdown.
        priority: 0..9, 9 taken first; None: the task's own.
        flow: the push's own named limit and key (``limits.check_call``); (None, None):
            the task's own flow control.
    """

    spec: TaskSpec = field(repr=False)
    app: Any = field(repr=False)
    on_commit: bool = True
    using: str | None = None
    when: Timing = NOW
    debounce: Debounce | None = None
    priority: int | None = None
    flow: tuple[str | None, str | None] = (None, None)

    def __post_init__(self) -> None:
        if not isinstance(self.on_commit, bool):
            raise TypeError(f"on_commit must be True or False, got {self.on_commit!r}")
        if self.using is not None and not (isinstance(self.using, str) and self.using):
            raise TypeError(f"using must be a database alias (a str) or None, got {self.using!r}")
        if self.using is not None and not self.on_commit:
            raise ValueError(
                f"{self.spec.name}: using={self.using!r} names the database whose commit the "
                "push waits for, and on_commit=False sends at once: pass one or the other"
            )

    def push(self, *args: Any, **kwargs: Any) -> Receipt:
        """Like ``task.push(*args, **kwargs)``, with these options."""
        return push(
            self.spec, self.app, args, kwargs, when=self.when, on_commit=self.on_commit,
            using=self.using, debounce=self.debounce, priority=self.priority, flow=self.flow,
        )  # fmt: skip

    async def apush(self, *args: Any, **kwargs: Any) -> Receipt:
        """Like ``await task.apush(*args, **kwargs)``, with these options."""
        return await apush(
            self.spec, self.app, args, kwargs, when=self.when, on_commit=self.on_commit,
            using=self.using, debounce=self.debounce, priority=self.priority, flow=self.flow,
        )  # fmt: skip


def replay(app: Any, envelope: str) -> Receipt:
    """Store and send, now, an envelope that a failed post-commit send logged.

    The envelope is verified (checksum, and signature when signing keys are set) and
    pushed under its own id, so a replay is safe to repeat: while the task is stored, a
    second replay re-sends fence 1, which the worker refuses (a fence starts once);
    for ``RESULT_TTL_S`` after it committed, a replay is answered as the push it
    repeats (its outcome names the push) and runs nothing; after it ended otherwise
    (the DLQ, a cancel), a replay raises ``DuplicateTaskId`` for as long.

    Raises:
        EnvelopeError: it does not verify.
        InvalidTaskId: its id breaks the id rule (``model.ids``): an envelope made
            before ids were checked, or by hand.
        ValueError: it is not a first incarnation (fence 1), or names a task that is
            not an ``@rl_task`` of ``app``.
        AdmissionRejected, DuplicateTaskId, Redis or broker errors: as ``push``.
    """
    cfg = config.current()
    text = envelope.strip()
    env = decode(text, cfg.signer)
    ids.check_id(env.id, "the replayed envelope's id")
    if env.fence != 1:
        raise ValueError(f"task {env.id}: only a first incarnation (fence 1) can be replayed")
    spec = getattr(app.tasks.get(env.task), "relier_spec", None)
    if not isinstance(spec, TaskSpec):
        raise ValueError(f"{env.task} is not an @rl_task registered on this Celery app")
    keys = KeySpace.of(cfg)
    p = _Push(cfg, spec, env, text, keys, gate=gate_for(cfg, spec, env, keys))
    logger.warning("replaying a push task=%s task_id=%s", env.task, env.id)
    return p.send_now(app, sync_client(cfg))
