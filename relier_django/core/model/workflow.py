"""A workflow's steps as its envelopes carry them, and what a committing step creates:
a chain's next step, or a chord's callback. Pure; no I/O.

Each step's envelope carries the steps still to come (``Envelope.chain``) and the
workflow's identity (``Envelope.workflow``: the first step's task id). When a step
commits, the worker builds the next step's envelope, with the step's result as its
first argument (as Celery passes it; not for an immutable ``.si()`` signature), and
``commit.lua`` stores and queues it in the same script as the commit: a step is never
done without its successor existing.

Celery's ``link=`` and ``link_error=`` ride in the envelope the same way
(``Envelope.link``, ``Envelope.link_error``): each callback is created by the commit,
with the result first (``linked``), and each errback by the filing in the DLQ, with
the failed task's id first (``errbacks``); each once, whatever the replays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .envelope import Envelope


@dataclass(frozen=True, slots=True)
class Step:
    """A step to come: its task, its frozen id, its own arguments, its queue, and
    whether it takes the previous step's result (``immutable``: it does not)."""

    task: str
    id: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str = ""
    immutable: bool = False
    version: int = 1  # the step task's argument schema, as its producer knew it
    # An errback's resurrection limit, resolved at push: a filing in the DLQ creates it
    # where no task registry is at hand (the scanner, the dispatcher). None elsewhere.
    max_resurrections: int | str | None = None  # model/resurrections.py's stored form
    priority: int | None = None  # 0..9 (9 taken first); absent from the wire when None
    # Its signature's own flow control (``.set(limit=, concurrency_key=)``), as
    # Envelope.limit and Envelope.limit_key; absent from the wire when None.
    limit: str | None = None
    limit_key: str | None = None
    # The callbacks this step's commit creates (a group that ends its chain: each member
    # given this step's result), as Step.wire() each; absent from the wire when empty.
    link: tuple[Mapping[str, Any], ...] = ()
    # A chord inside a chain (Celery's group followed by a step): a header member, made
    # a callback of the step before the group, carries its place in the header
    # ({"id", "index", "size", "callback"}); the chord's callback carries the steps
    # that follow it (``chain``). Absent from the wire when empty.
    chord: Mapping[str, Any] = field(default_factory=dict)
    chain: tuple[Mapping[str, Any], ...] = ()

    def wire(self) -> dict[str, Any]:
        out = {
            "task": self.task, "id": self.id, "args": list(self.args),
            "kwargs": dict(self.kwargs), "queue": self.queue, "immutable": self.immutable,
            "version": self.version,
        }  # fmt: skip
        if self.max_resurrections is not None:
            out["maxres"] = self.max_resurrections
        if self.priority is not None:
            out["priority"] = self.priority
        if self.limit is not None:
            out["limit"] = self.limit
        if self.limit_key is not None:
            out["limit_key"] = self.limit_key
        if self.link:
            out["link"] = [dict(raw) for raw in self.link]
        if self.chord:
            out["chord"] = dict(self.chord)
        if self.chain:
            out["chain"] = [dict(raw) for raw in self.chain]
        return out

    def flow(self) -> dict[str, Any]:
        """Its flow control as the envelope it becomes carries it."""
        return {"priority": self.priority, "limit": self.limit, "limit_key": self.limit_key}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Step:
        """Raises ValueError for a step that is not one (the envelope's checksum held,
        so only a faulty producer writes such a thing)."""
        try:
            step = cls(
                task=raw["task"], id=raw["id"], args=tuple(raw.get("args", ())),
                kwargs=dict(raw.get("kwargs", {})), queue=raw.get("queue", ""),
                immutable=bool(raw.get("immutable", False)), version=int(raw.get("version", 1)),
                max_resurrections=_maxres(raw.get("maxres")),
                priority=_priority(raw.get("priority")),
                limit=_text(raw.get("limit")), limit_key=_text(raw.get("limit_key")),
                link=tuple(dict(x) for x in raw.get("link", ())),
                chord=dict(raw.get("chord", {})),
                chain=tuple(dict(x) for x in raw.get("chain", ())),
            )  # fmt: skip
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a chain step is malformed: {raw!r}") from exc
        if not (isinstance(step.task, str) and isinstance(step.id, str) and step.id):
            raise ValueError(f"a chain step is malformed: {raw!r}")
        return step


def _maxres(value: Any) -> int | str | None:
    # An integer, or a policy by cause as model/resurrections.py writes it.
    if value is None or isinstance(value, str):
        return value
    return int(value)


def _priority(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a step's priority is not an int: {value!r}")
    return value


def _text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"a step's limit is not a str: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Next:
    """What a committing step creates: ``env``, always (a chain's next step), or once
    ``chord``'s header is complete (a chord's callback; ``chord`` is then the group id
    and ``index`` this member's place in the header)."""

    env: Envelope
    chord: str | None = None
    index: int = 0


def push_token_after(env: Envelope, step_id: str) -> str:
    """The push token (``Envelope.push``) of the task ``env``'s commit creates: derived
    from ``env``'s identity, so each creation of a step is a push of its own, and a
    commit built twice builds the same successor."""
    return hashlib.sha256(f"{env.identity}>{step_id}".encode()).hexdigest()[:16]


def chain_of(steps: Sequence[Step]) -> tuple[dict[str, Any], ...]:
    return tuple(step.wire() for step in steps)


def following(env: Envelope, result: Any, created_ms: int) -> Next | None:
    """What ``env``'s commit creates, given its result: the next step of its chain, or,
    for a chord's header member, the chord's callback (created only by the commit that
    completes the header; it takes the header's results first, read when it starts).

    Raises:
        ValueError: the chain's next step or the chord's callback is malformed.
    """
    if env.chain:
        nxt = successor(env, result, created_ms)
        return None if nxt is None else Next(nxt)
    if not env.chord:
        return None
    try:
        group_id, index = str(env.chord["id"]), int(env.chord["index"])
        step = Step.from_wire(env.chord["callback"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a chord member's chord is malformed: {env.chord!r}") from exc
    callback = Envelope(
        id=step.id, task=step.task, args=step.args, kwargs=dict(step.kwargs), queue=step.queue,
        created_ms=created_ms, schema_version=step.version, trace=env.trace,
        workflow=group_id, header="" if step.immutable else group_id,
        push=push_token_after(env, step.id), parent=env.id, chain=step.chain, link=step.link,
        **step.flow(),
    )  # fmt: skip
    return Next(callback, group_id, index)


def successor(env: Envelope, result: Any, created_ms: int) -> Envelope | None:
    """The envelope of the step after ``env``'s, given ``env``'s result; None when
    ``env`` is the last step (or not in a chain). A chain inside a chord's header
    passes its place in the header (``chord``) on, step by step, to its last step,
    whose commit is the one the chord counts; a step's callbacks (``link``: a group
    that ends the chain) ride in its envelope, created by its own commit.

    Raises:
        ValueError: the next step is malformed.
    """
    if not env.chain:
        return None
    step = Step.from_wire(env.chain[0])
    args = step.args if step.immutable else (result, *step.args)
    return Envelope(
        id=step.id, task=step.task, args=args, kwargs=dict(step.kwargs), queue=step.queue,
        created_ms=created_ms, schema_version=step.version, trace=env.trace,
        workflow=env.workflow or env.id,
        chain=env.chain[1:], chord=dict(env.chord), link=step.link,
        push=push_token_after(env, step.id), parent=env.id, **step.flow(),
    )  # fmt: skip


def _first_taking(env: Envelope, step: Step, first: Any, created_ms: int) -> Envelope:
    args = step.args if step.immutable else (first, *step.args)
    return Envelope(
        id=step.id, task=step.task, args=args, kwargs=dict(step.kwargs), queue=step.queue,
        created_ms=created_ms, schema_version=step.version, trace=env.trace,
        push=push_token_after(env, step.id), parent=env.id,
        chord=dict(step.chord), workflow=str(step.chord["id"]) if step.chord else "",
        **step.flow(),
    )  # fmt: skip


def holds_a_chord(env: Envelope) -> bool:
    """Whether ``env`` is a chord's header member, or its workflow opens a chord later
    (a group inside its chain)."""
    later = [*env.link, *(raw for step in env.chain for raw in step.get("link", ()))]
    return bool(env.chord) or any(raw.get("chord") for raw in later)


def planned(steps: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Every task ``steps`` (as ``Step.wire()`` gives them) will create, in order,
    each once, as (task id, task name): the steps, their callbacks (a group ending a
    chain, a chord's header inside it), a chord's callback and the steps after it."""
    out: dict[str, str] = {}

    def walk(raw: Mapping[str, Any]) -> None:
        out.setdefault(str(raw["id"]), str(raw["task"]))
        for link in raw.get("link", ()):
            walk(link)
        if raw.get("chord"):
            walk(raw["chord"]["callback"])
        for step in raw.get("chain", ()):
            walk(step)

    for raw in steps:
        walk(raw)
    return list(out.items())


def opened_chords(env: Envelope) -> dict[str, int]:
    """The chords ``env``'s commit opens (a group after it in its chain, Celery's chord
    inside a chain): each group id with its header's size, which the state must hold
    before a member can commit.

    Raises:
        ValueError: a member's place is malformed.
    """
    out: dict[str, int] = {}
    for raw in env.link:
        place = raw.get("chord")
        if not place:
            continue
        try:
            out[str(place["id"])] = int(place["size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a chord member's place is malformed: {place!r}") from exc
    return out


def linked(env: Envelope, result: Any, created_ms: int) -> tuple[Envelope, ...]:
    """The callbacks ``env``'s commit creates (``link=``), each taking ``result`` first
    unless immutable (``.si()``), as Celery applies them. Each is a task of its own
    (no workflow): it does not carry ``env``'s chain.

    Raises:
        ValueError: a link is malformed.
    """
    return tuple(_first_taking(env, Step.from_wire(raw), result, created_ms) for raw in env.link)


def errbacks(env: Envelope, created_ms: int) -> tuple[tuple[Envelope, int | str | None], ...]:
    """The errbacks ``env``'s filing in the DLQ creates (``link_error=``), each taking
    the failed task's id first unless immutable, with its resurrection limit (resolved
    at push).

    Raises:
        ValueError: an errback is malformed.
    """
    steps = [Step.from_wire(raw) for raw in env.link_error]
    return tuple(
        (_first_taking(env, step, env.id, created_ms), step.max_resurrections) for step in steps
    )
