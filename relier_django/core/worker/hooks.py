"""Worker lifecycle hooks, connected by ``@rl_task`` (idempotent).

- ``worker_init``: the worker refuses to start while relier's Redis is unreachable.
- ``celeryd_after_setup``: the worker consumes the recovery queue, whatever ``-Q``
  says, so resurrected tasks always find a consumer; and takes its messages with
  ``take.lua`` (``intake``), which marks each task held by it as it pops the message.
- ``worker_before_create_process``: before the prefork pool's first fork, what the
  main process holds is frozen out of the garbage collector's reach, so its pages stay
  shared with the pool processes (``forking``).
- ``worker_ready``: the embedded resurrector (a scanner thread in the worker's main
  process; passes never block task execution); a message from the recovery queue
  will wait for a free pool process ahead of the prefetched ones (see ``front``).
- ``worker_shutting_down`` (SIGTERM): stop scanning, hand reserved tasks off at once,
  running ones after the drain timeout (``handoff.lua``), so they restart elsewhere
  without waiting for a heartbeat TTL.
- ``task_received``: each prefetched/reserved message is covered by a heartbeat from
  the main process until a pool process accepts it (see ``reservations``).
- ``task_failure`` with ``WorkerLostError`` (a pool process died: SIGKILL, the OOM
  killer, a crash in C code): the main process hands the task it was running off at
  once (``handoff.lua``), so it is resurrected within a death check instead of after
  a heartbeat TTL. How it died (``signal:SIGKILL``, ``exit:3``, ``oom``: ``exits``)
  goes with the hand-off, for the task's history, the DLQ and ``task_resurrected``.
- ``task_failure`` with ``TimeLimitExceeded`` (Celery's hard time limit stopped a task:
  prefork kills the pool process): the main process dead-letters the incarnation it
  stopped at once, reason ``hard_timeout``, never to be resurrected for it.
- ``task_unknown``: an envelope for a task this worker does not know (a rolling
  deploy, a typo in a route) is dead-lettered with reason ``unknown_task`` instead of
  being discarded by Celery.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis
from celery import signals

from ..broker import publish
from ..model import config, links
from ..model.envelope import decode
from ..model.errors import EnvelopeError
from ..model.spec import TaskSpec
from ..recovery.scanner import Scanner
from ..store import event_loop, layout, liveness
from ..store.connection import describe, sync_client
from ..store.keys import KeySpace
from . import adoption, exits, fencing, forking, intake, pool_order, timeouts
from .reservations import Reservations, fence_of, waiting_request_ids
from .runner import Runner

logger = logging.getLogger("relier_django.signals")

_scanner: Scanner | None = None
_reservations: Reservations | None = None
_hostname: str | None = None  # this worker's node name (celeryd_after_setup)
_deaths: exits.Deaths | None = None  # names pool-process deaths (worker_ready)


def worker_id(hostname: object = None) -> str:
    """``hostname:pid`` of this process, as logged and stored in task hashes."""
    return f"{hostname or os.uname().nodename}:{os.getpid()}"


# A worker that cannot reach relier's Redis could neither start nor commit a task:
# every message it took would wait out a grace period before running elsewhere. It
# refuses to start instead, after a short wait for a Redis starting beside it.
_STARTUP_WAIT_S = 5.0


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Refuse to start (exit status 1) on settings that cannot be loaded, or while
    relier's Redis is unreachable."""
    cfg = _startup_config()
    deadline = time.monotonic() + _STARTUP_WAIT_S
    while True:
        try:
            client = sync_client(cfg, fail_fast=True)
            client.ping()
            recorded = layout.mismatch(client, KeySpace.of(cfg))
        except redis.exceptions.RedisClusterException as exc:
            # Not a RedisError: CLUSTER against a server that is not a cluster node.
            raise SystemExit(
                f"relier_django: {describe(cfg)}: {exc}; this worker refuses to start. "
                "Set CLUSTER only for a Redis Cluster (docs/scaling.md)."
            ) from exc
        except redis.exceptions.RedisError as exc:
            if time.monotonic() >= deadline:
                # SystemExit, not an Exception: Celery's signal dispatch logs and swallows
                # an Exception, and the worker would start anyway. Python prints the
                # message on stderr, even before logging is set up.
                raise SystemExit(
                    f"relier_django: Redis at {describe(cfg)} is unreachable ({exc}); "
                    "this worker refuses to start, since it could neither run nor commit a "
                    "task. Start that Redis, or correct the REDIS_URL setting "
                    "(RELIER_REDIS_URL)."
                ) from exc
            time.sleep(0.5)
            continue
        if recorded is None:
            return
        raise SystemExit(
            f"relier_django: the store at {describe(cfg)} was laid out for "
            f"{layout.describe(recorded)}, and this worker is configured for "
            f"{layout.describe(KeySpace.of(cfg).layout_value())}; it refuses to start, "
            "since it would look for every task in the wrong place. Set PARTITIONS and "
            "CLUSTER as the store's other processes have them (docs/scaling.md)."
        )


def _startup_config() -> config.Config:
    """The config, or SystemExit with one line naming every bad setting.

    A worker that started anyway would take messages only to fail each one with the
    same error, and those tasks would wait out QUEUED_GRACE_S before running elsewhere.
    """
    try:
        return config.current()
    except Exception as exc:
        # Any failure, not only a ConfigError (the Django layer raises its SettingsError,
        # one line naming every bad setting): without a config no task can run.
        # SystemExit, for the reason given in _on_worker_init.
        detail = " ".join(str(exc).split())
        raise SystemExit(
            f"relier_django: its settings cannot be loaded: {detail}; this worker refuses "
            "to start, since it would fail every task it took. Correct them in "
            f"settings.RELIER or the RELIER_* environment variables ({links.doc('settings.md')})."
        ) from exc


def _on_after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    global _hostname
    _hostname = sender  # Celery's node name, for the pool processes forked after this
    cfg = config.current()
    queue = cfg.recovery_queue
    instance.app.amqp.queues.select_add(publish.declare(instance.app, queue))
    logger.info("consuming the recovery queue %s", queue)
    intake.install(cfg, worker_id(sender))  # before the consumer takes its first message
    logger.info("relier's Redis: %s", describe(config.current()))  # passwords redacted


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    global _scanner, _reservations, _deaths
    cfg = config.current()
    if _deaths is None:  # OOM kills counted from here on are this worker's to name
        _deaths = exits.Deaths()
    if not pool_order.install(getattr(sender, "controller", None), cfg.recovery_queue):
        logger.info("resurrected tasks wait in line here: this pool keeps no prefetch wait")
    if _reservations is None:  # from now on, this worker shows in the live view
        _reservations = Reservations(
            cfg, waiting_request_ids, worker_id(getattr(sender, "hostname", None))
        )
        _reservations.start_thread()
    if not cfg.embedded_resurrector or _scanner is not None:
        return
    app = getattr(sender, "app", None)
    _scanner = Scanner(app, cfg, worker_id(getattr(sender, "hostname", None)))
    _scanner.start_thread()
    logger.info("embedded resurrector started scanner=%s", _scanner.scanner_id)


def _on_worker_shutting_down(sig: str = "", how: str = "", **_: Any) -> None:
    """Warm shutdown (SIGTERM): reserved tasks restart elsewhere now; running ones get
    ``DRAIN_TIMEOUT_S`` to finish in place, then are handed off too."""
    global _scanner, _reservations
    if _scanner is not None:
        _scanner.stop()  # releases the leader lease: another scanner takes over at once
        _scanner = None
    cfg = config.current()
    if _reservations is not None:
        try:
            handed = _reservations.handoff()
            logger.warning("shutdown: handed off %s reserved task(s)", handed)
        except Exception:
            logger.error(
                "shutdown: reserved-task hand-off failed; they expire in one TTL", exc_info=True
            )
        _reservations = None
    threading.Thread(
        target=_drain_then_handoff, args=(cfg,), name="relier-drain", daemon=True
    ).start()


def _active_envelopes() -> list[tuple[str, int]]:
    from celery.worker import state

    held = []
    for request in list(state.active_requests):
        fence = fence_of(getattr(request, "args", None))
        if fence is not None:
            held.append((request.id, fence))
    return held


def _drain_then_handoff(cfg: config.Config) -> None:
    time.sleep(cfg.drain_timeout_s)
    held = _active_envelopes()
    if not held:
        return
    try:
        keys = KeySpace.of(cfg)
        call = fencing.handoff(keys, held, state="running", cause="drain")
        handed = call.run(sync_client(cfg))
        logger.warning(
            "shutdown: drain timeout (%ss) passed; handed off %s running task(s) to resurrection",
            cfg.drain_timeout_s,
            handed,
        )
    except Exception:
        logger.error(
            "shutdown: running-task hand-off failed; they expire in one TTL", exc_info=True
        )


def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    global _reservations
    fence = fence_of(getattr(request, "args", None))
    if fence is None:
        fence = _adopted(request)
    if fence is None:
        return  # not an @rl_task envelope, nor a plain message this worker adopted
    if _reservations is None:
        host = getattr(request, "hostname", None)
        _reservations = Reservations(config.current(), waiting_request_ids, worker_id(host))
        _reservations.start_thread()
    _reservations.add(request.id, fence)


def _adopted(request: Any) -> int | None:
    """Adopt a plain Celery message for an ``@rl_task`` (``send_task`` by name) as it
    arrives, before a pool process accepts it (when Celery acks it): its first fence,
    or None for anything else. A failure here is not final: the pool process adopts
    it as it runs it (``adoption``)."""
    spec = getattr(getattr(request, "task", None), "relier_spec", None)
    if not isinstance(spec, TaskSpec):
        return None
    headers = getattr(request, "request_dict", None) or {}
    args, kwargs = getattr(request, "args", ()), getattr(request, "kwargs", {})
    if not adoption.is_plain(headers, args, kwargs):
        return None
    cfg = config.current()
    worker = worker_id(getattr(request, "hostname", None))
    queue = (getattr(request, "delivery_info", None) or {}).get("routing_key") or ""
    try:
        liveness.hold(cfg, worker)  # what it holds dies with its connection
        env = adoption.envelope_of(spec, request.id, args, kwargs, queue)
        found = adoption.adopt(cfg, spec, env, worker).run(sync_client(cfg))
    except Exception:
        logger.warning("could not adopt task_id=%s at receipt", request.id, exc_info=True)
        return None
    if not found.encoded:
        return None
    logger.debug("adopted a plain Celery message task_id=%s task=%s", request.id, spec.name)
    return 1 if found.new else fence_of([found.encoded])


def _on_task_failure(
    sender: Any = None, task_id: str = "", exception: Any = None, args: Any = None, **_: Any
) -> None:
    """A pool process died under one of our tasks: hand it off now.

    Celery's main process learns of the death at once (``WorkerLostError``), which the
    heartbeat would only show after its TTL. The task may have died running
    (``start.lua`` done) or between Celery's acceptance and ``start.lua``: both states
    are offered, and ``handoff.lua`` acts only on the one this fence holds, so a task
    that committed, or that another incarnation already superseded, is left alone.

    Celery's hard time limit (``TimeLimitExceeded``) is not a death but a verdict: see
    ``_on_time_limit``."""
    from billiard.exceptions import TimeLimitExceeded, WorkerLostError

    if isinstance(exception, TimeLimitExceeded):
        _on_time_limit(sender, task_id, exception, args)
        return
    if not isinstance(exception, WorkerLostError):
        return
    fence = fence_of(args)
    if fence is None:
        return  # not an @rl_task envelope
    cfg = config.current()
    keys, held = KeySpace.of(cfg), [(task_id, fence)]
    try:
        death = _death_of(exception)
        client = sync_client(cfg)
        handed = fencing.handoff(keys, held, state="running", cause="pool_death", death=death).run(
            client
        ) or fencing.handoff(keys, held, state="queued", cause="pool_death", death=death).run(
            client
        )
    except Exception:
        logger.error(
            "pool process died running task_id=%s; hand-off failed, it expires in one TTL",
            task_id,
            exc_info=True,
        )
        return
    if handed:
        logger.warning(
            "pool process died running task_id=%s fence=%s: handed off to resurrection (%s) "
            "death=%s",
            task_id,
            fence,
            exception,
            death or "unknown",
        )


def _death_of(exception: Any) -> str:
    global _deaths
    if _deaths is None:
        _deaths = exits.Deaths()
    return _deaths.cause(exception)


def _on_time_limit(sender: Any, task_id: str, exception: Any, args: Any) -> None:
    """Celery's hard time limit stopped one of our tasks: into the DLQ now.

    Prefork's main process kills the pool process and reports ``TimeLimitExceeded``
    twice (the job's failure callback, then its timeout callback: ``Request.on_failure``
    and ``Request.on_timeout``). Left alone, the stopped task would wait out a heartbeat TTL and be
    resurrected, to be stopped again until ``resurrection_limit``. It is dead-lettered
    with reason ``hard_timeout`` instead, fenced to the incarnation stopped and to its
    ``running`` state, so the second report, a commit that won the race, or a newer
    incarnation are left alone. One stopped before ``start.lua`` never ran: it is handed
    off to resurrection, as a dead process's would be."""
    fence = fence_of(args)
    if fence is None:
        return  # not an @rl_task envelope
    cfg = config.current()
    try:
        env = decode(args[0], cfg.signer)
    except EnvelopeError:
        return  # never started: the runner filed it when it arrived
    spec = getattr(sender, "relier_spec", None)
    ttl_s = getattr(spec, "result_ttl_s", None) or cfg.result_ttl_s
    limit_s = exception.args[0] if exception.args else "?"
    host = getattr(getattr(sender, "request", None), "hostname", None)
    keys = KeySpace.of(cfg)
    try:
        client = sync_client(cfg)
        moved = timeouts.killed(
            keys, env, limit_s, worker_id(host), int(ttl_s * 1000), cfg.signer
        ).run(client)
        handed = 0
        if not moved.accepted and moved.state == "queued" and moved.value == env.fence:
            call = fencing.handoff(keys, [(env.id, env.fence)], state="queued", cause="pool_death")
            handed = call.run(client)
    except Exception:
        logger.error(
            "hard time limit task_id=%s fence=%s: dead-letter failed; it expires in one TTL",
            task_id, fence, exc_info=True,
        )  # fmt: skip
        return
    if moved.accepted:
        logger.error(
            "hard time limit (%ss) task_id=%s fence=%s: dead-lettered reason=hard_timeout",
            limit_s, task_id, fence,
        )  # fmt: skip
    elif handed:
        logger.warning(
            "hard time limit task_id=%s fence=%s before it started: handed off to resurrection",
            task_id, fence,
        )  # fmt: skip
    else:  # the second report of the same stop, or the task had moved on
        logger.debug(
            "hard time limit task_id=%s fence=%s: nothing to file (current_fence=%s state=%s)",
            task_id, fence, moved.value, moved.state or "-",
        )  # fmt: skip


def _on_task_unknown(sender: Any = None, message: Any = None, name: str = "", **_: Any) -> None:
    try:
        body = message.decode() if message is not None else None
    except Exception:  # an undecodable body is not ours to judge; Celery already logged it
        return
    args = body[0] if isinstance(body, list | tuple) and body else None
    if args is None or fence_of(args) is None:
        return  # not an @rl_task message
    hostname = getattr(sender, "hostname", None)
    runner = Runner(None, getattr(sender, "app", None), config.current(), worker_id(hostname))
    try:
        event_loop.run(runner.run(args[0], expected_task=name), timeout_s=30)
    except Exception:
        logger.error(
            "could not dead-letter unknown task %s; body: %r", name, args[0], exc_info=True
        )


def _on_process_init(**_: Any) -> None:
    """A pool process names its liveness connection as it starts, before it can take a
    task: its death is then seen at once, even if it dies running its first task (the
    runner holds it too, for a pool made some other way)."""
    liveness.hold(config.current(), worker_id(_hostname))


def connect() -> None:
    """Connect the hooks (idempotent)."""
    uid = "relier_django."
    signals.worker_init.connect(_on_worker_init, dispatch_uid=uid + "worker_init", weak=False)
    signals.celeryd_after_setup.connect(
        _on_after_setup, dispatch_uid=uid + "after_setup", weak=False
    )
    signals.worker_ready.connect(_on_worker_ready, dispatch_uid=uid + "worker_ready", weak=False)
    signals.worker_before_create_process.connect(
        forking.freeze_before_first_fork, dispatch_uid=uid + "before_fork", weak=False
    )
    signals.worker_process_init.connect(
        _on_process_init, dispatch_uid=uid + "process_init", weak=False
    )
    signals.worker_shutting_down.connect(
        _on_worker_shutting_down, dispatch_uid=uid + "shutting_down", weak=False
    )
    signals.task_received.connect(_on_task_received, dispatch_uid=uid + "task_received", weak=False)
    signals.task_failure.connect(_on_task_failure, dispatch_uid=uid + "task_failure", weak=False)
    signals.task_unknown.connect(_on_task_unknown, dispatch_uid=uid + "task_unknown", weak=False)
