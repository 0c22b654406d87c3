"""One incarnation: verify → start → migrate → execute → commit | retry | dead-letter.

``async def`` tasks run on the process's bridge loop (``run``). Plain ``def`` tasks run
in the thread Celery calls them from (``run_blocking``): start and commit through the
process's sync client, the function inline, the heartbeat on the bridge loop; the rare
outcomes (a message that cannot be decoded or is addressed to another task, a failure,
a retry, the DLQ) cross to the loop and share ``run``'s code. The runner never imports
the producer: a retry re-publishes through ``broker`` directly.

With signing keys configured, every message is verified on arrival and every envelope
the runner writes (a retry, a DLQ entry) is signed with the newest key.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from ..broker import publish
from ..dlq import dead_letter as dlq
from ..model import outcome
from ..model.backoff import backoff_s
from ..model.config import Config
from ..model.envelope import Envelope, decode
from ..model.errors import EnvelopeError, TaskLost
from ..model.failure import Failure, Reason
from ..model.schema import Call, SchemaMismatch
from ..model.spec import TaskSpec
from ..model.transition import Transition
from ..store import bridge, checkpoint
from ..store.connection import async_client, sync_client
from ..store.keys import KeySpace
from ..store.scripts import ScriptCall
from . import fencing, heartbeat, timeouts
from .context import TaskContext
from .fencing import StartResult

logger = logging.getLogger("relier_django.runner")


class _Unrunnable(Exception):
    """The envelope verified, but this worker's code cannot run it (its schema).
    Private, so no task can raise it: it always means the DLQ, never a retry."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.exc_message)
        self.failure = failure


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
        self.keys = KeySpace(config.key_prefix)
        self.signer = config.signer  # verifies what arrives, signs what is re-published
        ttl_s = spec.result_ttl_s if spec and spec.result_ttl_s is not None else config.result_ttl_s
        self.result_ttl_ms = int(ttl_s * 1000)

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return async_client(self.config)

    async def run(self, raw: object, expected_task: str | None = None) -> None:
        """Execute one delivered message. Never raises for task-level failures: every
        outcome is a commit, a retry, a dead-letter, or a logged refusal."""
        try:
            env = decode(raw, self.signer)
        except EnvelopeError as exc:
            logger.error("undecodable message reason=%s: %s", exc.reason, exc)
            await self._dead(
                None,
                Failure(Reason(exc.reason), "EnvelopeError", str(exc), worker=self.worker),
                raw=exc.raw,
            )
            return
        if self.spec is None or env.task != (expected_task or self.spec.name):
            await self._dead(
                env,
                Failure(
                    Reason.UNKNOWN_TASK,
                    "NotRegistered",
                    f"no task named {env.task!r} on worker {self.worker}",
                    worker=self.worker,
                ),
                # Not started here: only a task still waiting for its start is ours to
                # file (another copy may be running it on a worker that knows it).
                held="queued",
            )
            return
        await self._incarnation(self.spec, env)

    def run_blocking(self, raw: object) -> None:
        """Execute one delivered message of a plain ``def`` task in the calling thread.

        The same outcomes as :meth:`run`, which it hands every message it cannot start
        (undecodable, addressed to another task, an ``async def`` task). A superseded
        incarnation learns it from ``ctx.is_current()``; it cannot be interrupted, and
        its commit is refused (G2)."""
        spec = self.spec
        try:
            env = decode(raw, self.signer)
        except EnvelopeError:
            env = None
        if env is None or spec is None or spec.is_async or env.task != spec.name:
            bridge.run(self.run(raw))
            return
        started = self._start_call(env).run(sync_client(self.config))
        if not started.started:
            self._refused(env, started)
            return
        ctx = self._context(env, bridge.loop())
        beats = heartbeat.for_loop(bridge.loop(), self.config)
        beats.add(env.id, env.fence, ctx.mark_lost)
        try:
            call = self._upgrade(spec, env)
            if started.checkpoint:
                ctx._partial = checkpoint.load(started.checkpoint)
            args = (ctx, *call.args) if spec.wants_context else call.args
            result = spec.fn(*args, **call.kwargs)
        except TaskLost:
            logger.warning("incarnation gave up: superseded task_id=%s fence=%s", env.id, env.fence)
            return
        except _Unrunnable as exc:
            beats.remove(env.id, env.fence)
            bridge.run(self._dead(env, exc.failure))
            return
        except Exception as exc:
            beats.remove(env.id, env.fence)  # before the outcome, as in _incarnation
            bridge.run(self._failed(spec, env, exc))
            return
        finally:
            beats.remove(env.id, env.fence)
        record = self._record(result, env.fence)
        if isinstance(record, Failure):
            bridge.run(self._dead(env, record))
            return
        done = fencing.commit(self.keys, env, record, self.result_ttl_ms).run(
            sync_client(self.config)
        )
        if self._committed(env, done) and self.config.checkpoint_dir is not None:
            checkpoint.remove_files(self.config.checkpoint_dir, env.id)

    def _start_call(self, env: Envelope) -> ScriptCall[StartResult]:
        ttl_ms = int(self.config.heartbeat_ttl_s * 1000)
        return fencing.start(self.keys, env, self.worker, ttl_ms)

    def _refused(self, env: Envelope, started: StartResult) -> None:
        # Internal outcome: nothing for a caller to see, but never silent.
        logger.warning(
            "message refused task_id=%s fence=%s reason=%s current_fence=%s",
            env.id,
            env.fence,
            started.refusal,
            started.current_fence,
        )

    def _context(self, env: Envelope, loop: asyncio.AbstractEventLoop) -> TaskContext:
        # The envelope is this incarnation's own checksummed record; the task hash's
        # counters may lag it (resurrected.lua counts only after the broker's ACK).
        ctx = TaskContext(env.id, env.fence, env.attempt, env.resurrections, env.task, self.worker)
        ctx._loop, ctx._save = loop, self._saver(ctx, env)
        return ctx

    async def _incarnation(self, spec: TaskSpec, env: Envelope) -> None:
        started = await self._start_call(env).arun(self.client)
        if not started.started:
            self._refused(env, started)
            return
        loop = asyncio.get_running_loop()
        ctx = self._context(env, loop)
        beats = heartbeat.for_running_loop(self.config)
        work = loop.create_task(self._invoke(spec, ctx, env, started.checkpoint))

        def lost() -> None:
            ctx.mark_lost()
            work.cancel()

        beats.add(env.id, env.fence, lost)
        timers = timeouts.arm(spec, ctx, work)
        try:
            result = await work
        except asyncio.CancelledError:
            if ctx.hard_timed_out:
                beats.remove(env.id, env.fence)
                await self._dead(env, timeouts.failure(spec, self.worker))
                return
            if ctx.is_current():
                raise  # the worker itself is shutting down
            logger.warning(
                "incarnation cancelled: superseded task_id=%s fence=%s", env.id, env.fence
            )
            return
        except TaskLost:
            logger.warning("incarnation gave up: superseded task_id=%s fence=%s", env.id, env.fence)
            return
        except _Unrunnable as exc:
            beats.remove(env.id, env.fence)
            await self._dead(env, exc.failure)
            return
        except Exception as exc:
            # Out of the heartbeat set before the outcome: a retry moves the fence, and
            # that must not read as this incarnation being superseded.
            beats.remove(env.id, env.fence)
            if ctx.hard_timed_out:  # it turned the cancellation into an error of its own
                await self._dead(env, timeouts.failure(spec, self.worker))
                return
            await self._failed(spec, env, exc)
            return
        finally:
            timers.cancel()
            beats.remove(env.id, env.fence)
        if ctx.hard_timed_out:  # it swallowed the cancellation: still past its deadline
            await self._dead(env, timeouts.failure(spec, self.worker))
            return
        await self._commit(env, result)

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
        if stored_checkpoint:  # a file checkpoint is read and hashed off the loop
            ctx._partial = await asyncio.to_thread(checkpoint.load, stored_checkpoint)
        args = (ctx, *call.args) if spec.wants_context else call.args
        if spec.is_async:
            return await spec.fn(*args, **call.kwargs)
        return await asyncio.to_thread(spec.fn, *args, **call.kwargs)

    async def _arguments(self, spec: TaskSpec, env: Envelope) -> Call:
        if env.schema_version == spec.schema.version:
            return self._upgrade(spec, env)
        # A migration may read a database: off the loop, like a plain def task.
        return await asyncio.to_thread(self._upgrade, spec, env)

    def _upgrade(self, spec: TaskSpec, env: Envelope) -> Call:
        """The envelope's arguments, migrated to this worker's schema in memory (the
        stored envelope keeps the producer's version, so any worker can replay it)."""
        schema = spec.schema
        try:
            call = schema.upgrade(spec.name, env.schema_version, env.args, env.kwargs)
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
            logger.info(
                "migrated arguments task_id=%s schema v%s->v%s",
                env.id, call.migrated_from, schema.version,
            )  # fmt: skip
        return call

    async def _commit(self, env: Envelope, result: Any) -> None:
        record = self._record(result, env.fence)
        if isinstance(record, Failure):
            await self._dead(env, record)
            return
        done = await fencing.commit(self.keys, env, record, self.result_ttl_ms).arun(self.client)
        if self._committed(env, done) and self.config.checkpoint_dir is not None:
            await asyncio.to_thread(checkpoint.remove_files, self.config.checkpoint_dir, env.id)

    def _record(self, result: Any, fence: int) -> str | Failure:
        """The result as committed, or the DLQ failure of one that is not JSON."""
        try:
            return outcome.succeeded(result, fence)
        except (TypeError, ValueError, RecursionError) as exc:
            # RecursionError: nested deeper than json can write. Uncaught, it would
            # escape the runner and the task would come back until resurrection_limit.
            return Failure(
                Reason.RESULT_NOT_SERIALIZABLE,
                type(exc).__name__,
                f"the task returned a {type(result).__name__}, which is not JSON: {exc}",
                worker=self.worker,
            )

    def _committed(self, env: Envelope, done: Transition) -> bool:
        if done.accepted:
            logger.info("committed task_id=%s fence=%s", env.id, env.fence)
        else:
            logger.warning(
                "stale commit rejected task_id=%s fence=%s current_fence=%s",
                env.id,
                env.fence,
                done.value,
            )
        return done.accepted

    async def _failed(self, spec: TaskSpec, env: Envelope, exc: Exception) -> None:
        retryable = isinstance(exc, spec.retry_on) if spec.retry_on else False
        max_retries = spec.max_retries if spec.max_retries is not None else self.config.max_retries
        error = f"{type(exc).__name__}: {exc}"
        if retryable and env.attempt <= max_retries:
            await self._retry(spec, env, error)
            return
        reason = Reason.RETRIES_EXHAUSTED if retryable else Reason.EXCEPTION
        failure = Failure(
            reason,
            type(exc).__name__,
            str(exc),
            "".join(traceback.format_exception(exc)),
            worker=self.worker,
        )
        await self._dead(env, failure)

    async def _retry(self, spec: TaskSpec, env: Envelope, error: str) -> None:
        delay_s = backoff_s(
            env.attempt,
            spec.retry_backoff_s
            if spec.retry_backoff_s is not None
            else self.config.retry_backoff_s,
            spec.retry_backoff_max_s
            if spec.retry_backoff_max_s is not None
            else self.config.retry_backoff_max_s,
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
            return
        logger.info(
            "retrying task_id=%s attempt=%s in %.2fs after %s", env.id, nxt.attempt, delay_s, error
        )
        try:
            await publish.asend(self.app, nxt, encoded, delay_s)
        except Exception:
            # Stored and covered by the expiry index: it is re-dispatched once its
            # queued grace runs out, so nothing is lost; only delayed.
            logger.error(
                "retry publish failed task_id=%s fence=%s", env.id, nxt.fence, exc_info=True
            )

    async def reject_malformed(self, detail: str, raw: object) -> None:
        """Dead-letter a message that is not an envelope at all, keeping what arrived."""
        failure = Failure(Reason.MALFORMED_MESSAGE, "NotAnEnvelope", detail, worker=self.worker)
        await self._dead(None, failure, raw=raw)

    async def _dead(
        self, env: Envelope | None, failure: Failure, raw: object = None, held: str = "running"
    ) -> None:
        # A message that is no envelope is filed under the task it was addressed to.
        task = self.spec.name if self.spec is not None else ""
        call = dlq.dead_letter(
            self.keys, failure, self.result_ttl_ms, env=env, raw=raw, queue=self.queue,
            task=task, signer=self.signer, held=held,
        )  # fmt: skip
        moved = await call.arun(self.client)
        if moved.accepted:
            logger.error(
                "dead-lettered task_id=%s reason=%s error=%s",
                env.id if env else "-",
                failure.reason,
                failure.error,
            )
        else:
            logger.warning(
                "dead-letter refused task_id=%s fence=%s current_fence=%s state=%s held=%s",
                env and env.id,
                env and env.fence,
                moved.value,
                moved.state or "-",
                held,
            )
