"""The push pipeline: validate arguments, build the envelope, store it (and claim the
idempotency key) in one script, then hand it to the broker.

``push`` is for sync code, ``apush`` for async code; both share ``prepare`` and make
the same calls: one Redis round trip (push.lua) plus the broker publish.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import admission, bridge, broker, config, idempotency
from .connection import async_client, sync_client
from .envelope import Envelope, canonical
from .errors import AdmissionRejected, DuplicateTaskId
from .keys import KeySpace
from .receipt import Receipt
from .scripts import ScriptCall
from .spec import TaskSpec

logger = logging.getLogger("relier_django.producer")


def _check_json(spec: TaskSpec, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    try:
        bound = spec.user_signature().bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{spec.name}: {exc}") from None
    for name, value in bound.arguments.items():
        try:
            canonical(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{spec.name}: argument {name!r} is a {type(value).__name__}, which cannot be "
                f"sent as JSON ({exc}); pass plain JSON values (str, int, float, bool, None, "
                "list, dict with str keys), e.g. an id instead of a model instance"
            ) from None


def prepare(
    spec: TaskSpec, args: Sequence[Any], kwargs: Mapping[str, Any], task_id: str | None = None
) -> Envelope:
    """Validate the call and build its first envelope (fence 1). Raises ``TypeError``
    for arguments that do not fit the signature or are not JSON-serialisable."""
    _check_json(spec, args, kwargs)
    idem = idempotency.derive_key(spec.idempotency_key, args, kwargs) if spec.idempotent else None
    return Envelope(
        id=task_id or uuid.uuid4().hex,
        task=spec.name,
        args=tuple(args),
        kwargs=dict(kwargs),
        queue=spec.queue or "",
        idem_key=idem,
        created_ms=int(time.time() * 1000),
    )


@dataclass(frozen=True, slots=True)
class _Push:
    """One push in progress: what both ``push`` and ``apush`` compute before I/O."""

    cfg: config.Config
    spec: TaskSpec
    env: Envelope
    encoded: str
    keys: KeySpace

    @classmethod
    def begin(
        cls, spec: TaskSpec, args: Sequence[Any], kwargs: Mapping[str, Any], task_id: str | None
    ) -> _Push:
        cfg = config.current()
        env = prepare(spec, args, kwargs, task_id)
        return cls(cfg, spec, env, env.encode(), KeySpace(cfg.key_prefix))

    def store(self) -> ScriptCall[idempotency.StoreResult]:
        grace_ms = int(self.cfg.queued_grace_s * 1000)
        limit = self.spec.max_resurrections
        limit = self.cfg.max_resurrections if limit is None else limit
        gates = admission.limits(self.keys, self.cfg, self.spec.name, self.spec.rate_limit)
        return idempotency.store(self.keys, self.env, self.encoded, grace_ms, limit, gates)

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
        if stored.id_in_dlq:
            raise DuplicateTaskId(
                f"task id {self.env.id!r} names an entry in the dead-letter queue; release it "
                f"(`manage.py relier_dlq release {self.env.id}`) or delete it, or push with "
                "another id"
            )
        if stored.stored:
            return None
        logger.info("idempotent duplicate task=%s task_id=%s", self.env.task, stored.task_id)
        return Receipt(stored.task_id, deduplicated=True, config=self.cfg)

    def receipt(self) -> Receipt:
        return Receipt(self.env.id, deduplicated=False, config=self.cfg)


def push(
    spec: TaskSpec,
    app: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    task_id: str | None = None,
) -> Receipt:
    """Sync push. See ``RelierTask.push`` for the guarantees."""
    if bridge.in_running_loop():
        raise RuntimeError(
            f"{spec.name}.push() was called inside a running event loop, where it would "
            f"block; use `await {spec.name.rsplit('.', 1)[-1]}.apush(...)` instead"
        )
    p = _Push.begin(spec, args, kwargs, task_id)
    client = sync_client(p.cfg)
    if (dup := p.duplicate(p.store().run(client))) is not None:
        return dup
    try:
        broker.send(app, p.env, p.encoded)
    except BaseException:
        idempotency.abort(p.keys, p.env).run(client)
        raise
    return p.receipt()


async def apush(
    spec: TaskSpec,
    app: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    task_id: str | None = None,
) -> Receipt:
    """Async push: the same steps as :func:`push`, without blocking the event loop."""
    p = _Push.begin(spec, args, kwargs, task_id)
    client = async_client(p.cfg)
    if (dup := p.duplicate(await p.store().arun(client))) is not None:
        return dup
    try:
        await broker.asend(app, p.env, p.encoded)
    except BaseException:
        await idempotency.abort(p.keys, p.env).arun(client)
        raise
    return p.receipt()
