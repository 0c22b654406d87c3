"""One incarnation: verify → start → migrate → execute → commit | retry | dead-letter.

``async def`` tasks run on the process's bridge loop (``run``). Plain ``def`` tasks run
in the thread Celery calls them from (``run_blocking``): start and commit through the
process's sync client, the function inline, the heartbeat on the bridge loop; the rare
outcomes (a message that cannot be decoded or is addressed to another task, a failure,
a retry, the DLQ) cross to the loop and share ``run``'s code. Both paths end in one
classification (``_outcome``: commit, retry, dead-letter or nothing) and the message
is decoded once. The runner never imports the producer: a retry re-publishes through
``broker`` directly.

``run`` and ``run_blocking`` return how the message ended (``ending.Ended``): the
Celery task body turns it into Celery's own ending, so Celery reports a task the way
relier settled it. The runner itself imports nothing of Celery's exceptions.

With signing keys configured, every message is verified on arrival and every envelope
the runner writes (a retry, a DLQ entry) is signed with the newest key.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .. import crashpoint
from ..broker import publish
from ..dlq import dead_letter as dlq
from ..model import limits, outcome, resurrections, tracing, workflow
from ..model.backoff import backoff_s
from ..model.config import Config
from ..model.envelope import Envelope, decode
from ..model.errors import EnvelopeError, TaskLost
from ..model.failure import Failure, Reason
from ..model.request import Request, RetryPolicy
from ..model.schema import Call, SchemaMismatch
from ..model.spec import TaskSpec
from ..model.transition import Transition
from ..store import checkpoint, chords, event_loop, handover, liveness
from ..store.connection import async_client, sync_client
from ..store.keys import KeySpace
from ..store.scripts import ScriptCall
from . import atomic, fencing, heartbeat, progress, timeouts
from .context import TaskContext
from .ending import Ended, Ending
from .fencing import StartResult

logger = logging.getLogger("relier_django.runner")


class _Unrunnable(Exception):
    """The envelope verified, but this worker's code cannot run it (its schema).
    Private, so no task can raise it: it always means the DLQ, never a retry."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.exc_message)
        self.failure = failure


@dataclass(frozen=True, slots=True)
class _Commit:
    record: str  # the outcome record, as commit.lua stores it
    # What the commit creates (a chain's next step, with the result as its first
    # argument; a chord's callback, once the header is complete), encoded.
    following: workflow.Next | None = None
    encoded: str = ""
    # The successor's flow control (its gate's script argument, '' for none): a gated
    # successor is stored to wait for its slot or its rate, never queued by the commit.
    gate: str = ""
    # The callbacks (link=) the commit creates, each with the result first.
    links: tuple[fencing.Linked, ...] = ()
    # The chords whose headers those callbacks are (a group inside a chain): group id ->
    # the header's size, recorded before the commit can create a member.
    opens: Mapping[str, int] = field(default_factory=dict)

    @property
    def successor(self) -> Envelope | None:
        return None if self.following is None else self.following.env


@dataclass(frozen=True, slots=True)
class _Retry:
    error: str  # one line, for the history
    delay_s: float | None = None  # self.retry()'s; None: the task's backoff
    asked: bool = False  # by self.retry(), whose exc= is then the ending's error
    exc: Exception | None = None


@dataclass(frozen=True, slots=True)
class _Dead:
    failure: Failure


@dataclass(frozen=True, slots=True)
class _Died:
    # A MemoryError escaped the task (a process under RLIMIT_AS): handed off as a death
    # of cause 'oom', so max_resurrections' limit for 'oom' decides, as for an OOM kill.
    death: str
    detail: str


_Action = _Commit | _Retry | _Dead | _Died


class Runner:
    """Runs messages of one task definition with one config."""

    def __init__(
        self, spec: TaskSpec | None, app: Any, config: Config, worker: str, queue: str = ""
    ) -> None:
        self.spec = spec
        self.queue = queue  # where the message arrived: kept with one that is no envelope
        self.app = app
        self.config = config
        self.worker = worker
        self.keys = KeySpace.of(config)
        self.signer = config.signer  # verifies what arrives, signs what is re-published
        ttl_s = spec.result_ttl_s if spec and spec.result_ttl_s is not None else config.result_ttl_s
        self.result_ttl_ms = int(ttl_s * 1000)
        # The async incarnation in progress, and what interrupted the thread waiting for
        # it (see interrupt()).
        self._work: asyncio.Task[Any] | None = None
        self._interrupted: BaseException | None = None

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return async_client(self.config)

    async def run(self, raw: object, expected_task: str | None = None) -> Ended:
        """Execute one delivered message. Never raises for task-level failures: every
        outcome is a commit, a retry, a dead-letter, or a logged refusal.

        Returns:
            How the message ended, with the result or the task's own exception.
        """
        return await self._route(raw, self._decode(raw), expected_task)

    def run_blocking(self, raw: object) -> Ended:
        """Execute one delivered message of a plain ``def`` task in the calling thread.

        The same outcomes as :meth:`run`, which it hands every message it cannot start
        (undecodable, addressed to another task, an ``async def`` task). A superseded
        incarnation learns it from ``ctx.is_current()``; it cannot be interrupted, and
        its commit is refused (G2)."""
        spec, env = self.spec, self._decode(raw)
        if isinstance(env, Envelope) and spec and not spec.is_async and env.task == spec.name:
            return self._blocking_incarnation(spec, env)
        return event_loop.run(self._route(raw, env))

    def _decode(self, raw: object) -> Envelope | EnvelopeError:
        try:
            return decode(raw, self.signer)
        except EnvelopeError as exc:
            return exc

    async def _route(
        self, raw: object, env: Envelope | EnvelopeError, expected_task: str | None = None
    ) -> Ended:
        """A decoded message to its incarnation, or to the DLQ when it cannot have one."""
        if isinstance(env, EnvelopeError):
            logger.error("undecodable message reason=%s: %s", env.reason, env)
            failure = Failure(Reason(env.reason), "EnvelopeError", str(env), worker=self.worker)
            return await self._dead(None, failure, raw=env.raw)
        if self.spec is None or env.task != (expected_task or self.spec.name):
            failure = Failure(
                Reason.UNKNOWN_TASK, "NotRegistered",
                f"no task named {env.task!r} on worker {self.worker}", worker=self.worker,
            )  # fmt: skip
            # Not started here: only a task still waiting for its start is ours to file
            # (another copy may be running it on a worker that knows it).
            return await self._dead(env, failure, held="queued")
        return await self._incarnation(self.spec, env)

    def _blocking_incarnation(self, spec: TaskSpec, env: Envelope) -> Ended:
        started = self._start_call(env).run(sync_client(self.config))
        if not started.started:
            if started.refusal == "expired":
                return event_loop.run(self._expired(env))
            return self._refused(env, started)
        ctx = self._context(env, event_loop.loop(), started)
        beats = heartbeat.for_loop(event_loop.loop(), self.config)
        beats.add(env.id, env.fence, ctx.mark_lost)
        result: Any = None
        error: BaseException | None = None
        try:
            call = self._upgrade(spec, env)
            ctx._request = self._request(ctx, env, call)
            if started.checkpoint:
                ctx._partial = checkpoint.load(started.checkpoint)
            args = (ctx, *call.args) if spec.wants_context else call.args
            with tracing.run_span(env):
                result = atomic.body(spec.atomic, ctx, spec.fn)(*args, **call.kwargs)
        except (Exception, TaskLost) as exc:
            error = exc
        finally:
            beats.remove(env.id, env.fence)
        action = self._outcome(spec, env, ctx, result, error)
        if isinstance(action, _Commit) and self._hands_over(action):
            return self._handing_over(spec, env, action, result)
        if isinstance(action, _Commit):  # the common case: no crossing to the loop
            client = sync_client(self.config)
            message = None
            if action.successor is not None and not action.gate:
                message = publish.message_for_store(
                    self.app, action.successor, action.encoded, client
                )
            self._open_chords(action.opens, client)
            crashpoint.cross(crashpoint.BEFORE_COMMIT, env.task)
            done = fencing.commit(
                self.keys, env, action.record, self.result_ttl_ms, spec.keep_trail,
                self._successor(action, message), action.links,
            ).run(client)  # fmt: skip
            _crossed_commit(env, done)
            if self._committed(env, done) and self.config.checkpoint_dir is not None:
                checkpoint.remove_files(self.config.checkpoint_dir, env.id)
            if done.accepted and done.value == 1 and message is None and not action.gate:
                event_loop.run(self._publish_successor(action))
            self._after_commit(env, done, client, action.opens)
            return self._commit_ended(env, done, result)
        if action is None:
            return _superseded(env)
        return event_loop.run(self._act(spec, env, action, result, _own(action, error)))

    def _start_call(self, env: Envelope) -> ScriptCall[StartResult]:
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        # Named after this process before it holds anything: its death is then seen
        # the moment its connection closes (store/liveness.py), not a TTL later.
        liveness.hold(self.config, self.worker)
        return fencing.start(self.keys, env, self.worker, ttl_ms)

    def _refused(self, env: Envelope, started: StartResult) -> Ended:
        # A stale or duplicate copy: never silent, and never a failure of the task.
        logger.warning(
            "message refused task_id=%s fence=%s reason=%s current_fence=%s",
            env.id,
            env.fence,
            started.refusal,
            started.current_fence,
        )
        return Ended(Ending.REFUSED, env.id, detail=f"start refused: {started.refusal}")

    def _context(
        self, env: Envelope, loop: asyncio.AbstractEventLoop, started: StartResult
    ) -> TaskContext:
        # The envelope is this incarnation's own checksummed record; the task hash's
        # counters may lag it (resurrected.lua counts only after the broker's ACK).
        ctx = TaskContext(env.id, env.fence, env.attempt, env.resurrections, env.task, self.worker)
        ctx.identity = env.identity
        if started.due_ms is not None:
            ctx.scheduled_at = datetime.fromtimestamp(started.due_ms / 1000, tz=UTC)
        ctx._loop, ctx._save = loop, self._saver(ctx, env)
        spec = self.spec
        if spec is not None:
            ctx._retry_policy = RetryPolicy(
                spec.max_retries if spec.max_retries is not None else self.config.max_retries,
                spec.default_retry_delay_s,
            )
        ctx._report = progress.reporter(lambda: self.client, self.keys, env, ctx.mark_lost)
        return ctx

    def _request(self, ctx: TaskContext, env: Envelope, call: Call) -> Request:
        """Celery's ``self.request``: the arguments as the body gets them (migrated)."""
        return Request(
            env.id, env.task, env.attempt - 1, call.args, call.kwargs,
            scheduled_at=ctx.scheduled_at,
            hostname=self.worker.rpartition(":")[0], queue=self.queue or env.queue,
            workflow=env.workflow, priority=env.priority, parent=env.parent,
            expires_ms=env.expires_ms,
            # As Celery: only a chain's last step is its chord header's member.
            chord_member={} if env.chain else env.chord,
        )  # fmt: skip

    async def _expired(self, env: Envelope) -> Ended:
        # Its expires= time passed before any start: filed, never run (G11).
        failure = Failure(
            Reason.EXPIRED, None, "it was not started before its expiry", worker=self.worker
        )
        return await self._dead(env, failure, held="queued")

    async def _incarnation(self, spec: TaskSpec, env: Envelope) -> Ended:
        started = await self._start_call(env).arun(self.client)
        if not started.started:
            if started.refusal == "expired":
                return await self._expired(env)
            return self._refused(env, started)
        loop = asyncio.get_running_loop()
        ctx = self._context(env, loop, started)
        beats = heartbeat.for_running_loop(self.config)
        work = loop.create_task(self._invoke(spec, ctx, env, started.checkpoint))

        def lost() -> None:
            ctx.mark_lost()
            work.cancel()

        beats.add(env.id, env.fence, lost)
        timers = timeouts.arm(spec, ctx, work)
        self._work = work
        result: Any = None
        error: BaseException | None = None
        try:
            result = await work
        except asyncio.CancelledError as exc:
            if self._interrupted is not None:
                error = self._interrupted  # Celery's soft limit, meant for this task
            elif not ctx.hard_timed_out and ctx.is_current():
                raise  # the worker itself is shutting down
            else:
                error = exc  # a hard timeout, or the incarnation was superseded
        except (Exception, TaskLost) as exc:
            error = exc
        finally:
            # Out of the heartbeat set before the outcome: a retry moves the fence, and
            # that must not read as this incarnation being superseded.
            timers.cancel()
            beats.remove(env.id, env.fence)
            self._work = None
        action = self._outcome(spec, env, ctx, result, error)
        if action is None:
            return _superseded(env)
        return await self._act(spec, env, action, result, _own(action, error))

    def interrupt(self, error: BaseException) -> None:
        """From the pool thread waiting for an ``async def`` incarnation: stop it, and
        let ``error`` decide its ending as if the task had raised it. A worker-wide
        Celery soft time limit lands in that waiting thread, not in the coroutine; a
        ``def`` task that let it escape is dead-lettered, and so is this one."""

        def stop() -> None:
            if self._work is not None and not self._work.done():
                self._interrupted = error
                self._work.cancel()

        event_loop.loop().call_soon_threadsafe(stop)

    def _outcome(
        self, spec: TaskSpec, env: Envelope, ctx: TaskContext, result: Any,
        error: BaseException | None,
    ) -> _Action | None:  # fmt: skip
        """What an incarnation's ending means, for ``def`` and ``async def`` tasks alike:
        commit, retry, dead-letter, or nothing (it was superseded)."""
        if isinstance(error, _Unrunnable):
            return _Dead(error.failure)
        if isinstance(error, TaskLost):
            logger.warning("incarnation gave up: superseded task_id=%s fence=%s", env.id, env.fence)
            return None
        if ctx.hard_timed_out:
            # Cancelled at its deadline, or it turned the cancellation into an error of
            # its own, or swallowed it: past its deadline all the same.
            return _Dead(timeouts.failure(spec, self.worker))
        if isinstance(error, asyncio.CancelledError):
            logger.warning(
                "incarnation cancelled: superseded task_id=%s fence=%s", env.id, env.fence
            )
            return None
        asked = ctx._retry
        if asked is not None and not asked.exhausted:
            # self.retry(): whatever ended the body after it (its Retry, a return with
            # throw=False, an error), the retry it decided is what happens.
            return _Retry(asked.error, asked.delay_s, True, asked.exc)
        limit = timeouts.soft_limit_failure(spec, error, self.worker)
        if limit is not None:
            # Celery's soft time limit, uncaught: the hard one would stop the next
            # incarnation too, so no retry unless retry_on names it.
            return _Dead(limit)
        if isinstance(error, MemoryError) and not isinstance(error, spec.retry_on):
            # Out of memory under RLIMIT_AS is the OOM killer's verdict arrived as an
            # exception: the same death, the same policy (docs/worker-death.md), unless
            # the task asked to retry on it.
            return _Died("oom", f"MemoryError: {error}" if str(error) else "MemoryError")
        if isinstance(error, Exception):
            return self._failed(spec, env, error, exhausted=asked is not None)
        record = self._record(result, env.fence, env.push)
        if isinstance(record, Failure):
            return _Dead(record)
        now_ms = int(time.time() * 1000)
        try:
            nxt = workflow.following(env, result, now_ms)
            links = tuple(self._linked(link) for link in workflow.linked(env, result, now_ms))
            opens = workflow.opened_chords(env)
        except ValueError as exc:  # only a faulty producer writes such a workflow
            detail = f"the workflow after this step cannot be read: {exc}"
            return _Dead(
                Failure(Reason.MALFORMED_MESSAGE, type(exc).__name__, detail, worker=self.worker)
            )
        if nxt is None:
            return _Commit(record, links=links, opens=opens)
        try:
            gate = self._gate(nxt.env)
        except ValueError as exc:  # a ConfigError too: a limit= the settings lack
            detail = f"the workflow's next step {nxt.env.task} cannot be gated: {exc}"
            return _Dead(Failure(Reason.MALFORMED_MESSAGE, type(exc).__name__, detail,
                                 worker=self.worker))  # fmt: skip
        return _Commit(record, nxt, nxt.env.encode(self.signer), gate, links, opens)

    def _linked(self, link: Envelope) -> fencing.Linked:
        """A callback as the commit creates it. Raises ValueError (a ConfigError too)
        when its flow control cannot be read."""
        spec = getattr(self.app.tasks.get(link.task), "relier_spec", None)
        limit = getattr(spec, "max_resurrections", None)
        return fencing.Linked(
            link, link.encode(self.signer),
            resurrections.stored(limit, self.config.resurrection_policy()), self._gate(link),
        )  # fmt: skip

    def _gate(self, nxt: Envelope) -> str:
        """The successor's flow-control gate, as commit.lua takes it ('' for none). On
        a partitioned store, where flow control is refused at push, a workflow's later
        step runs ungated (docs/flow-control.md)."""
        spec = getattr(self.app.tasks.get(nxt.task), "relier_spec", None)
        if spec is None or not (spec.limits or nxt.limit) or self.keys.tagged:
            return ""
        found = limits.gate_of(spec.name, spec.limits, self.config.named_limits(),
                               spec.user_signature(), nxt.args, nxt.kwargs, nxt.limit,
                               nxt.limit_key)  # fmt: skip
        return "" if found is None else found.script_arg()

    def _successor(
        self, action: _Commit, message: publish.Queued | None
    ) -> fencing.Successor | None:
        following = action.following
        if following is None:
            return None
        nxt = following.env
        spec = getattr(self.app.tasks.get(nxt.task), "relier_spec", None)
        limit = getattr(spec, "max_resurrections", None)
        return fencing.Successor(
            nxt, action.encoded, message, int(self.config.queued_grace_s * 1000),
            resurrections.stored(limit, self.config.resurrection_policy()),
            following.chord, following.index, outcome.result_json(action.record), action.gate,
        )  # fmt: skip

    def _hands_over(self, action: _Commit) -> bool:
        # A partitioned store: what the commit brings about lives in other partitions.
        return self.keys.tagged and (action.following is not None or bool(action.links))

    def _handing_over(self, spec: TaskSpec, env: Envelope, action: _Commit, result: Any) -> Ended:
        """Commit with a hand-over record, then complete it (store/handover.py). A
        completion that fails, or a death before it, is the scanner leader's sweep's."""
        client = sync_client(self.config)
        following: list[fencing.Successor | fencing.Linked] = [*action.links]
        successor, member = self._successor(action, None), None
        if successor is not None and successor.chord is not None:
            # A chord's member: its result goes to the chord's partition, and the
            # callback with it, for the member that completes the header.
            callback = _handed(successor)
            member = handover.Member(successor.chord, successor.index, successor.result, callback)
        elif successor is not None:
            following.insert(0, successor)
        marker_ttl_ms = max(self.result_ttl_ms, int(self.config.result_ttl_s * 1000))
        stored = handover.record([_handed(t) for t in following], marker_ttl_ms, member)
        self._open_chords(action.opens, client)
        crashpoint.cross(crashpoint.BEFORE_COMMIT, env.task)
        done = fencing.commit_handing_over(
            self.keys, env, action.record, self.result_ttl_ms, spec.keep_trail, stored
        ).run(client)
        _crossed_commit(env, done)
        if self._committed(env, done):
            if self.config.checkpoint_dir is not None:
                checkpoint.remove_files(self.config.checkpoint_dir, env.id)
            try:
                handover.complete(client, self.keys, env.id, stored)
            except Exception:
                logger.warning(
                    "hand-over not completed, left to the scanner's sweep task_id=%s",
                    env.id, exc_info=True,
                )  # fmt: skip
        self._after_commit(env, done, client, action.opens)
        return self._commit_ended(env, done, result)

    def _hand_errbacks_over(self, env: Envelope) -> None:
        # The errbacks a partitioned store's filing recorded (dead_letter.lua): stored
        # now, or by the scanner's sweep if this fails (store/handover.py).
        try:
            part, token = self.keys.of_task(env.id), dlq.errback_token(env)
            handover.complete_recorded(sync_client(self.config), self.keys, part, token)
        except Exception:
            logger.warning(
                "errbacks' hand-over not completed, left to the scanner's sweep task_id=%s",
                env.id, exc_info=True,
            )  # fmt: skip

    def _open_chords(self, opens: Mapping[str, int], client: Any) -> None:
        """Record the size of each chord this commit opens (a group inside a chain),
        before the commit creates its members: the state knows the size before any
        member can commit. Idempotent; a commit refused after it leaves a state that
        expires (chords.KEEP_MS), or that the next incarnation's commit completes."""
        for group_id, size in opens.items():
            chords.set_size(client, self.keys, group_id, size)

    def _after_commit(
        self, env: Envelope, done: Transition, client: Any, opens: Mapping[str, int]
    ) -> None:
        # The members of a chord this commit opened all exist now: its state outlives
        # any wait (a member in the DLQ), as a chord whose producer stored its header.
        for group_id, size in opens.items() if done.accepted else ():
            try:
                chords.seal(client, self.keys, group_id, size - 1)
            except Exception:  # it keeps its TTL then, as a producer's unsealed header
                logger.warning("could not seal chord %s's state", group_id, exc_info=True)
        # A chord's callback committed: its header's results are no longer needed.
        if env.header and done.accepted:
            try:
                chords.forget(client, self.keys, env.header)
            except Exception:  # kept, then, until it expires (chords.KEEP_MS)
                logger.warning("could not drop chord %s's state", env.header, exc_info=True)

    async def _publish_successor(self, action: _Commit) -> None:
        """Publish a successor the commit stored but could not queue (the broker is not
        the store's Redis). A publish lost here is covered: the stored successor is
        re-dispatched after the queued grace, like a push whose producer died."""
        assert action.successor is not None
        try:
            await publish.asend(self.app, action.successor, action.encoded)
        except Exception:
            logger.warning(
                "chain step stored, its publish failed; re-dispatched after the queued "
                "grace task_id=%s", action.successor.id, exc_info=True,
            )  # fmt: skip

    async def _act(
        self, spec: TaskSpec, env: Envelope, action: _Action, result: Any, error: Exception | None
    ) -> Ended:
        if isinstance(action, _Commit) and self._hands_over(action):
            return await asyncio.to_thread(self._handing_over, spec, env, action, result)
        if isinstance(action, _Commit):
            message = None
            if action.successor is not None and not action.gate:
                message = await publish.amessage_for_store(
                    self.app, action.successor, action.encoded, self.client
                )
            if action.opens:
                await asyncio.to_thread(self._open_chords, action.opens, sync_client(self.config))
            crashpoint.cross(crashpoint.BEFORE_COMMIT, env.task)
            done = await fencing.commit(
                self.keys, env, action.record, self.result_ttl_ms, spec.keep_trail,
                self._successor(action, message), action.links,
            ).arun(self.client)  # fmt: skip
            _crossed_commit(env, done)
            if self._committed(env, done) and self.config.checkpoint_dir is not None:
                await asyncio.to_thread(checkpoint.remove_files, self.config.checkpoint_dir, env.id)
            if done.accepted and done.value == 1 and message is None and not action.gate:
                await self._publish_successor(action)
            if env.header or action.opens:
                await asyncio.to_thread(
                    self._after_commit, env, done, sync_client(self.config), action.opens
                )
            return self._commit_ended(env, done, result)
        if isinstance(action, _Retry):
            return await self._retry(spec, env, action, action.exc if action.asked else error)
        if isinstance(action, _Died):
            return await self._died(env, action)
        return await self._dead(env, action.failure, error=error)

    async def _died(self, env: Envelope, action: _Died) -> Ended:
        call = fencing.handoff(
            self.keys, [(env.id, env.fence)], state="running", cause="pool_death",
            death=action.death,
        )  # fmt: skip
        if not await call.arun(self.client):
            return Ended(Ending.REFUSED, env.id, detail="hand-off refused: superseded")
        logger.warning(
            "incarnation handed off task_id=%s fence=%s death=%s: %s",
            env.id, env.fence, action.death, action.detail,
        )  # fmt: skip
        return Ended(
            Ending.HANDED_OFF, env.id, detail=f"handed off ({action.death}): {action.detail}"
        )

    @staticmethod
    def _commit_ended(env: Envelope, done: Transition, result: Any) -> Ended:
        if not done.accepted:
            return Ended(Ending.REFUSED, env.id, detail="commit refused: superseded")
        return Ended(Ending.COMMITTED, env.id, result=result)

    def _saver(self, ctx: TaskContext, env: Envelope) -> Callable[[Any], Awaitable[None]]:
        async def save(state: Any) -> None:
            if self.config.checkpoint_dir is None:
                stored = checkpoint.record(self.config, env.id, env.fence, state)
            else:  # may write a file: keep the loop free
                stored = await asyncio.to_thread(
                    checkpoint.record, self.config, env.id, env.fence, state
                )
            done = await checkpoint.save(self.keys, env.id, env.fence, stored).arun(self.client)
            if not done.accepted:
                ctx.mark_lost()
                raise TaskLost(f"task {env.id}: fence {env.fence} was superseded; not saved")
            if self.config.checkpoint_dir is not None:
                await asyncio.to_thread(
                    checkpoint.remove_superseded_files, self.config.checkpoint_dir, env.id, stored
                )

        return save

    async def _invoke(
        self, spec: TaskSpec, ctx: TaskContext, env: Envelope, stored_checkpoint: str
    ) -> Any:
        call = await self._arguments(spec, env)
        ctx._request = self._request(ctx, env, call)
        if stored_checkpoint:  # a file checkpoint is read and hashed off the loop
            ctx._partial = await asyncio.to_thread(checkpoint.load, stored_checkpoint)
        args = (ctx, *call.args) if spec.wants_context else call.args
        with tracing.run_span(env):  # copied into to_thread's context too
            if spec.is_async:
                return await spec.fn(*args, **call.kwargs)
            fn = atomic.body(spec.atomic, ctx, spec.fn)
            return await asyncio.to_thread(fn, *args, **call.kwargs)

    async def _arguments(self, spec: TaskSpec, env: Envelope) -> Call:
        if env.schema_version == spec.schema.version and not env.header:
            return self._upgrade(spec, env)
        # A migration may read a database: off the loop, like a plain def task.
        return await asyncio.to_thread(self._upgrade, spec, env)

    def _upgrade(self, spec: TaskSpec, env: Envelope) -> Call:
        """The envelope's arguments, migrated to this worker's schema in memory (the
        stored envelope keeps the producer's version, so any worker can replay it)."""
        schema = spec.schema
        args = env.args
        if env.header:  # a chord's callback: its header's results come first
            try:
                results = chords.header_results(sync_client(self.config), self.keys, env.header)
            except chords.HeaderMissing as exc:
                failure = Failure(
                    Reason.EXCEPTION, "ChordHeaderMissing", str(exc), worker=self.worker
                )
                raise _Unrunnable(failure) from exc
            args = (results, *args)
        try:
            call = schema.upgrade(spec.name, env.schema_version, args, env.kwargs)
            schema.fit(spec.name, spec.user_signature(), call)
        except SchemaMismatch as exc:
            failure = Failure(
                Reason.SCHEMA_MIGRATION, "SchemaMismatch", str(exc),
                # The user's migration failed: its traceback is what to fix.
                "".join(traceback.format_exception(exc)) if exc.__cause__ else None,
                worker=self.worker,
                extra={"envelope_schema": exc.envelope_version, "worker_schema": schema.version},
            )  # fmt: skip
            raise _Unrunnable(failure) from exc
        if call.migrated_from is not None:
            logger.debug(
                "migrated arguments task_id=%s schema v%s->v%s",
                env.id, call.migrated_from, schema.version,
            )  # fmt: skip
        return call

    def _record(self, result: Any, fence: int, push: str = "") -> str | Failure:
        """The result as committed, or the DLQ failure of one that is not JSON or is
        larger than ``RESULT_MAX_BYTES``."""
        try:
            record = outcome.succeeded(result, fence, push)
        except (TypeError, ValueError, RecursionError) as exc:
            # RecursionError: nested deeper than json can write. Uncaught, it would
            # escape the runner and the task would come back until resurrection_limit.
            return Failure(
                Reason.RESULT_NOT_SERIALIZABLE,
                type(exc).__name__,
                f"the task returned a {type(result).__name__}, which is not JSON: {exc}",
                worker=self.worker,
            )
        # Checked before commit.lua: a result Redis refuses would fail the commit, the
        # task would be resurrected and its body run again, max_resurrections + 1 times,
        # to land in the DLQ as resurrection_limit. Refused here, it runs once.
        too_large = outcome.too_large(record, self.config.result_max_bytes)
        if too_large is not None:
            return Failure(Reason.RESULT_TOO_LARGE, "ResultTooLarge", too_large, worker=self.worker)
        return record

    def _committed(self, env: Envelope, done: Transition) -> bool:
        if done.accepted:
            logger.debug("committed task_id=%s fence=%s", env.id, env.fence)
        else:
            logger.warning(
                "stale commit rejected task_id=%s fence=%s current_fence=%s",
                env.id,
                env.fence,
                done.value,
            )
        return done.accepted

    def _failed(
        self, spec: TaskSpec, env: Envelope, exc: Exception, exhausted: bool = False
    ) -> _Action:
        """A task that raised: retried while ``retry_on`` allows it, else dead-lettered.
        ``exhausted``: it raised after ``self.retry()`` found no retries left."""
        retryable = isinstance(exc, spec.retry_on) if spec.retry_on else False
        max_retries = spec.autoretry_max_retries(self.config.max_retries)
        if retryable and not exhausted and env.attempt <= max_retries:
            return _Retry(f"{type(exc).__name__}: {exc}", spec.autoretry_countdown_s)
        reason = Reason.RETRIES_EXHAUSTED if retryable or exhausted else Reason.EXCEPTION
        trace = "".join(traceback.format_exception(exc))
        # The importable path too: django.tasks' TaskError resolves the class from it.
        path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        return _Dead(
            Failure(
                reason, type(exc).__name__, str(exc), trace, worker=self.worker,
                extra={"exc_path": path},
            )
        )  # fmt: skip

    async def _retry(
        self, spec: TaskSpec, env: Envelope, action: _Retry, exc: Exception | None
    ) -> Ended:
        error, delay_s = action.error, action.delay_s
        if delay_s is None:
            delay_s = backoff_s(
                env.attempt,
                spec.retry_backoff_s
                if spec.retry_backoff_s is not None
                else self.config.retry_backoff_s,
                spec.retry_backoff_max_s
                if spec.retry_backoff_max_s is not None
                else self.config.retry_backoff_max_s,
                jitter=spec.retry_jitter,
            )
        # From the envelope as received, not the migrated call: the stored copy keeps
        # the producer's schema version.
        nxt = env.next_incarnation(attempt=env.attempt + 1)
        encoded = nxt.encode(self.signer)
        grace_ms = int(self.config.queued_grace_s * 1000)
        call = fencing.retry(
            self.keys, env, nxt, int(delay_s * 1000), grace_ms, error, encoded=encoded
        )
        stored = await call.arun(self.client)
        if not stored.accepted:
            logger.warning(
                "stale retry rejected task_id=%s fence=%s current_fence=%s",
                env.id,
                env.fence,
                stored.value,
            )
            return Ended(Ending.REFUSED, env.id, detail="retry refused: superseded")
        logger.info(
            "retrying task_id=%s attempt=%s in %.2fs after %s", env.id, nxt.attempt, delay_s, error
        )
        if stored.state == "scheduled":
            # It waits in the schedule index, in no worker's memory: the scanner leader
            # publishes it when due.
            return Ended(Ending.RETRIED, env.id, error=exc, detail=error, delay_s=delay_s)
        try:
            await publish.asend(self.app, nxt, encoded, delay_s)
        except Exception:
            # Stored and covered by the expiry index: it is re-dispatched once its
            # queued grace runs out, so nothing is lost; only delayed.
            logger.error(
                "retry publish failed task_id=%s fence=%s", env.id, nxt.fence, exc_info=True
            )
        return Ended(Ending.RETRIED, env.id, error=exc, detail=error, delay_s=delay_s)

    async def reject_malformed(self, detail: str, raw: object) -> Ended:
        """Dead-letter a message that is not an envelope at all, keeping what arrived."""
        failure = Failure(Reason.MALFORMED_MESSAGE, "NotAnEnvelope", detail, worker=self.worker)
        return await self._dead(None, failure, raw=raw)

    async def _dead(
        self,
        env: Envelope | None,
        failure: Failure,
        raw: object = None,
        held: str = "running",
        error: Exception | None = None,
    ) -> Ended:
        # A message that is no envelope is filed under the task it was addressed to.
        task = self.spec.name if self.spec is not None else ""
        call = dlq.dead_letter(
            self.keys, failure, self.result_ttl_ms, env=env, raw=raw, queue=self.queue,
            task=task, signer=self.signer, held=held,
        )  # fmt: skip
        moved = await call.arun(self.client)
        task_id = env.id if env else None
        if moved.accepted and env is not None and env.link_error and self.keys.tagged:
            await asyncio.to_thread(self._hand_errbacks_over, env)
        if moved.accepted:
            # An operator must act: the task's own traceback comes with the line.
            logger.error(
                "dead-lettered task_id=%s reason=%s error=%s",
                task_id or "-",
                failure.reason,
                failure.error,
                exc_info=error,
            )
            return Ended(
                Ending.DEAD, task_id, error=error, reason=str(failure.reason), detail=failure.error
            )
        logger.warning(
            "dead-letter refused task_id=%s fence=%s current_fence=%s state=%s held=%s",
            env and env.id,
            env and env.fence,
            moved.value,
            moved.state or "-",
            held,
        )
        return Ended(Ending.REFUSED, task_id, detail=f"dead-letter refused (held {held})")


def _handed(task: fencing.Successor | fencing.Linked) -> handover.Handed:
    return handover.Handed(task.env.id, task.encoded, task.env.task, task.env.queue,
                           task.max_resurrections)  # fmt: skip


def _crossed_commit(env: Envelope, done: Transition) -> None:
    # A refused commit is a boundary too, but not a commit: crash tests count commits.
    accepted = crashpoint.AFTER_COMMIT if done.accepted else crashpoint.AFTER_REFUSED_COMMIT
    crashpoint.cross(accepted, env.task)


def _superseded(env: Envelope) -> Ended:
    # Another incarnation holds the task: this one decides nothing (already logged).
    return Ended(Ending.REFUSED, env.id, detail="superseded")


def _own(action: _Action, error: BaseException | None) -> Exception | None:
    """The task's own exception behind a retry or a dead-letter, when the failure is
    that exception: not a schema refusal, not a hard timeout's cancellation (or the
    error a task turned it into), not a result that is not JSON."""
    if not isinstance(error, Exception) or isinstance(error, _Unrunnable):
        return None
    if isinstance(action, _Retry):
        return error
    if isinstance(action, _Dead) and action.failure.exc_type == type(error).__name__:
        return error
    return None
