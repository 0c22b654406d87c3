"""A workflow's record (``keys.workflow``): which tasks make it up, so that its state
can be read by its id (``relier_django.workflow``) and listed in the admin. Written by
the producer when it stores the workflow's first task (a chain's first step, a
group's or a chord header's members); each task's own state stays where it always is.
Idempotent writes (the same fields each time), so a replayed push changes nothing.
On a partitioned store the record (its workflow's partition) and the index (``{g}``)
are in two slots, which one MULTI cannot span: they are written in one pipeline
without it, and a push interrupted between them leaves a record the next member's
push completes, or one the admin does not list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model.config import Config
from .connection import sync_client
from .keys import KeySpace
from .receipt import TaskStatus, read_status

KEEP_MS = 7 * 24 * 3600 * 1000  # as long as a chord's state
LISTED = 1000  # the newest workflows the index keeps, for the admin


@dataclass(frozen=True, slots=True)
class Record:
    """What one push adds to its workflow's record: ``kind`` (chain, group, chord),
    ``members``: (position, task id, task name) of each task it names (a position
    ``"<index>.<k>"``: the k-th step of a chain at ``index`` in a chord's header);
    ``callback``: a chord's (task id, task name)."""

    workflow: str
    kind: str
    created_ms: int
    members: Sequence[tuple[int | str, str, str]] = ()
    callback: tuple[str, str] | None = None

    def _queue(self, pipe: Any, keys: KeySpace) -> None:
        key = keys.workflow(self.workflow)
        fields: dict[str, Any] = {"kind": self.kind, "created_ms": self.created_ms}
        fields.update({f"s:{pos}": f"{task_id}|{name}" for pos, task_id, name in self.members})
        if self.callback is not None:
            fields["callback"] = "|".join(self.callback)
        pipe.hsetnx(key, "first_ms", self.created_ms)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, KEEP_MS)
        pipe.zadd(keys.workflows, {self.workflow: self.created_ms}, nx=True)
        pipe.zremrangebyrank(keys.workflows, 0, -LISTED - 1)

    def run(self, client: Any, keys: KeySpace) -> None:
        pipe = client.pipeline(transaction=not keys.tagged)
        self._queue(pipe, keys)
        pipe.execute()

    async def arun(self, client: Any, keys: KeySpace) -> None:
        pipe = client.pipeline(transaction=not keys.tagged)
        self._queue(pipe, keys)
        await pipe.execute()


@dataclass(frozen=True, slots=True)
class Step:
    """One task of a workflow and where it stands (``status.state``: Celery's name)."""

    position: int | None  # None: a chord's callback
    task_id: str
    task: str
    status: TaskStatus


@dataclass(frozen=True, slots=True)
class WorkflowView:
    """A workflow read by its id: its kind and its tasks, each with its state.

    Attributes:
        done / failed / pending: the tasks committed, in the DLQ, and not finished yet
            (a chain's later steps do not exist until the step before commits: they
            are pending, and unknown to the store).
    """

    workflow: str
    kind: str
    created_ms: int
    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def done(self) -> list[Step]:
        return [s for s in self.steps if s.status.state == "SUCCESS"]

    @property
    def failed(self) -> list[Step]:
        return [s for s in self.steps if s.status.state == "FAILURE"]

    @property
    def pending(self) -> list[Step]:
        return [s for s in self.steps if s.status.state not in ("SUCCESS", "FAILURE", "REVOKED")]

    @property
    def state(self) -> str:
        """``SUCCESS`` when every task committed; ``FAILURE`` when one is in the DLQ
        (the workflow waits for its release); ``REVOKED`` when one was cancelled (a
        member the rest depends on waits in the DLQ too, reason ``cancelled``, until
        it is released); else ``PENDING``."""
        if self.failed:
            return "FAILURE"
        if any(s.status.state == "REVOKED" for s in self.steps):
            return "REVOKED"
        return "SUCCESS" if not self.pending else "PENDING"


def read(config: Config, workflow: str) -> WorkflowView | None:
    """The workflow ``workflow`` (its first task's id for a chain, the group's id for a
    group or a chord), or None when no record of it is kept."""
    keys = KeySpace.of(config)
    raw = sync_client(config).hgetall(keys.workflow(workflow))
    if not raw:
        return None
    fields = {_text(k): _text(v) for k, v in raw.items()}
    named = sorted(
        (tuple(int(part) for part in name[2:].split(".")), value)
        for name, value in fields.items()
        if name.startswith("s:")
    )
    entries: list[tuple[int | None, str]] = [(place[0], value) for place, value in named]
    if "callback" in fields:
        entries.append((None, fields["callback"]))
    steps = []
    for position, value in entries:
        task_id, _, task = value.partition("|")
        steps.append(Step(position, task_id, task, read_status(config, task_id)))
    return WorkflowView(
        workflow, fields.get("kind", ""), int(fields.get("first_ms", 0)), tuple(steps)
    )


def recent(config: Config, limit: int = 20) -> list[str]:
    """The ids of the newest workflows, newest first."""
    keys = KeySpace.of(config)
    return [_text(w) for w in sync_client(config).zrevrange(keys.workflows, 0, limit - 1)]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
