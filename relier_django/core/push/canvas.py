"""Celery's canvas as relier reads it at push: the signatures Celery's ``chain``,
``chord`` and ``link=`` hand a task's ``apply_async``, turned into the steps its
envelope carries (``model.workflow.Step``), each checked now, before anything is
stored: a step is created later by a commit or a filing, where no caller is left to
hear that it cannot run.

- ``chain=``: the steps after the first task, last step first (Celery's order). The
  chain's last step may be a chord header's member (Celery puts the chord's place on
  a chain's last step: a chain inside a chord's header), and may be a group (its
  members run after the step before it, each given that step's result: they become
  that step's callbacks). A group followed by a step is Celery's chord inside the
  chain: its members become the step before's callbacks too, each carrying its place
  in the header, the header's size and the chord's callback, which carries the steps
  after it.
- ``chord=``: a header member's place (group id, index, callback).
- ``link=`` / ``link_error=``: callbacks and errbacks.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery.canvas import maybe_signature

from ..model import arguments, config, ids, links, options, resurrections, workflow
from ..model.spec import TaskSpec


@dataclass(frozen=True, slots=True)
class Rest:
    """The steps after a chain's first task (``steps``, in order), the chord place of
    the chain's last task when the chain is a member of a chord's header (``chord``,
    carried by every step until the last one commits), and the callbacks of the first
    task itself (``link``: a group that directly follows it)."""

    steps: list[workflow.Step] = field(default_factory=list)
    chord: dict[str, Any] = field(default_factory=dict)
    link: list[workflow.Step] = field(default_factory=list)


def rest(app: Any, given: Sequence[Any]) -> Rest:
    """The rest of a chain from Celery's ``chain=`` option (last step first).

    Raises:
        TypeError: a step that is not an ``@rl_task`` signature (a plain Celery task,
            whose step relier could not fence), a group anywhere but last (unless Celery
            made it a chord with the step after it), a step whose own arguments do not
            fit its task (the previous result not counted), or a step with links of
            its own.
        InvalidTaskId: a frozen id (a step's, a group id) that breaks the id rule.
    """
    ordered = [maybe_signature(sig, app=app) for sig in reversed(list(given))]
    if any(sig.options.get("chord") is not None for sig in ordered[:-1]):
        raise TypeError("only a chain's last step can be a chord header's member")
    steps, leading = _walk(app, ordered)
    if not ordered or ordered[-1].options.get("chord") is None:
        return Rest(steps, {}, leading)
    if any(_name(sig) in ("celery.chord", "celery.group") for sig in ordered):
        raise TypeError(
            "a chain with a group inside it, inside a chord's header, is not supported "
            "yet: end the chain with a task"
        )
    return Rest(steps, _chain_chord(app, ordered[-1]), leading)


def _name(sig: Any) -> str | None:
    name = getattr(sig, "task", None)
    return name if isinstance(name, str) else None


def _walk(app: Any, ordered: Sequence[Any]) -> tuple[list[workflow.Step], list[workflow.Step]]:
    """The steps of ``ordered`` (in chain order) up to the first group or chord, and
    the callbacks of the task before them when that group or chord comes first: a
    group (last) or a chord's header is created by the commit of the step before it,
    as that step's callbacks; what follows a chord rides with its callback."""
    steps: list[workflow.Step] = []
    for k, sig in enumerate(ordered):
        if _name(sig) == "celery.chord":
            members = _chord_in_chain(app, sig, ordered[k + 1 :])
        elif _name(sig) == "celery.group" and k == len(ordered) - 1:
            members = _group_members(app, sig)
        else:
            steps.append(_step(app, sig))
            continue
        if not steps:
            return steps, members
        last = steps[-1]
        steps[-1] = dataclasses.replace(last, link=(*last.link, *workflow.chain_of(members)))
        break
    return steps, []


def _chord_in_chain(app: Any, sig: Any, after: Sequence[Any]) -> list[workflow.Step]:
    """Celery's chord inside a chain (a group followed by a step): its header's members,
    each a callback of the step before it carrying its place in the header (with the
    header's size, which the committing step records) and the chord's callback, which
    carries the steps after it."""
    header = sig.tasks
    signatures = [maybe_signature(m, app=app) for m in getattr(header, "tasks", header)]
    if not signatures:
        raise TypeError("an empty group in the middle of a chain is not supported")
    body = maybe_signature(sig.body, app=app)
    body_sigs = list(body.tasks) if _name(body) == "celery.chain" else [body]
    then, leading = _walk(app, [*[maybe_signature(b, app=app) for b in body_sigs[1:]], *after])
    callback = dataclasses.replace(
        _step(app, maybe_signature(body_sigs[0], app=app)),
        chain=workflow.chain_of(then), link=workflow.chain_of(leading),
    )  # fmt: skip
    group_id = getattr(header, "options", {}).get("task_id") or sig.options.get("task_id")
    group_id = str(group_id or uuid.uuid4().hex)
    ids.check_id(group_id, "group_id")
    members = linked(app, signatures, errback=False, option="a group in a chain")
    return [
        dataclasses.replace(member, chord={
            "id": group_id, "index": i, "size": len(members), "callback": callback.wire(),
        })
        for i, member in enumerate(members)
    ]  # fmt: skip


def chord_place(app: Any, group_id: Any, index: Any, body: Any) -> dict[str, Any]:
    """A chord header member's place: the group's id, the member's index in the
    header and the callback (Celery's ``group_id``, ``group_index``, ``chord``).

    Raises:
        TypeError: the callback is not an ``@rl_task`` signature, or cannot take the
            header's results first.
        InvalidTaskId: the group's or the callback's id breaks the id rule.
    """
    if group_id is not None:
        ids.check_id(str(group_id), "group_id")
    callback = _step(app, maybe_signature(body, app=app))
    return {"id": group_id, "index": index, "callback": callback.wire()}


def _chain_chord(app: Any, last: Any) -> dict[str, Any]:
    """The chord place Celery put on a chain's last step (a chain inside a chord's
    header), or ``{}``."""
    chosen = last.options
    if chosen.get("chord") is None:
        return {}
    return chord_place(app, chosen.get("group_id"), chosen.get("group_index"), chosen["chord"])


def _spec(app: Any, sig: Any) -> TaskSpec | None:
    name = getattr(sig, "task", None)
    spec = getattr(app.tasks.get(name) if isinstance(name, str) else None, "relier_spec", None)
    return spec if isinstance(spec, TaskSpec) else None


def _step(app: Any, sig: Any) -> workflow.Step:
    """One later step of a chain (or a chord's callback), checked."""
    spec = _spec(app, sig)
    if spec is None:
        name = getattr(sig, "task", None)
        what = name if isinstance(name, str) else type(sig).__name__
        raise TypeError(
            f"chain step {what!r} is not an @rl_task: relier creates each step in the "
            "same script that commits the one before, which it cannot do for a plain "
            f"Celery task or a group before a group ({links.doc('workflows.md')})"
        )
    chosen = sig.options
    if chosen.get("link") or chosen.get("link_error"):
        raise TypeError(
            f"chain step {spec.name!r} has a link= or link_error= of its own (a "
            "chain's link goes to its last step), which relier does not support yet; "
            "link the chain's first task, or add the callback as a step"
        )
    sig_args, sig_kwargs = tuple(sig.args), dict(sig.kwargs)
    # The previous step's result comes first: its type is only known then.
    arguments.check(spec, sig_args if sig.immutable else (None, *sig_args), sig_kwargs)
    task_id = chosen.get("task_id")
    if task_id is not None:
        ids.check_id(task_id, f"chain step {spec.name!r} task_id")
    flow = _flow(chosen, spec, f"chain step {spec.name!r}")
    return workflow.Step(
        task=spec.name, id=task_id or uuid.uuid4().hex, args=sig_args, kwargs=sig_kwargs,
        queue=chosen.get("queue") or spec.queue or "", immutable=bool(sig.immutable),
        version=spec.schema.version, priority=_priority(chosen, spec),
        limit=flow["limit"], limit_key=flow["limit_key"],
    )  # fmt: skip


def _group_members(app: Any, group: Any) -> list[workflow.Step]:
    """A group that ends a chain: each member a callback of the step before it, given
    that step's result first (unless immutable), as Celery applies the group."""
    if group.options.get("chord") is not None:
        raise TypeError(
            "a chain that ends with a group, inside a chord's header, is not supported "
            "yet: end the chain with a task"
        )
    return linked(app, list(group.tasks), errback=False, option="a chain's last group")


def linked(
    app: Any, given: Any, *, errback: bool, option: str | None = None
) -> list[workflow.Step]:
    """The callbacks (``link=``) or errbacks (``link_error=``) of a push, from one
    signature or a list of them, each checked now: a callback takes the result first,
    an errback the failed task's id (unless immutable, ``.si()``).

    Raises:
        TypeError: a signature that is not a plain ``@rl_task`` one (a plain Celery
            task, a group, a chain, a signature with links of its own), whose arguments
            do not fit its task, or an errback whose task has flow control.
        InvalidTaskId: a frozen ``task_id`` that breaks the id rule (``model.ids``).
    """
    if given is None:
        return []
    option = option or ("link_error" if errback else "link")
    return [
        _linked_one(app, maybe_signature(sig, app=app), errback, option)
        for sig in (given if isinstance(given, list | tuple) else [given])
    ]


def _linked_one(app: Any, sig: Any, errback: bool, option: str) -> workflow.Step:
    spec = _spec(app, sig)
    if spec is None or sig.options.get("chain"):
        name = getattr(sig, "task", None)
        what = name if isinstance(name, str) else type(sig).__name__
        raise TypeError(
            f"{option}={what!r} is not an @rl_task signature: relier creates it in the "
            f"same script that ends this task, which it cannot do for a plain Celery "
            f"task, a group, a chain or a chord ({links.doc('workflows.md', 'links')})"
        )
    if sig.options.get("link") or sig.options.get("link_error"):
        raise TypeError(f"{option}={spec.name!r} has links of its own: not supported yet")
    flow = _flow(sig.options, spec, f"{option} {spec.name!r}")
    if errback and (spec.limits or flow["limit"] or flow["limit_key"]):
        raise TypeError(
            f"link_error={spec.name!r}: an errback whose task has flow control "
            "(concurrency=, limit=, rate=, or a signature's own) is not supported yet"
        )
    sig_args, sig_kwargs = tuple(sig.args), dict(sig.kwargs)
    # What comes first is known only then: the result, or the failed task's id.
    arguments.check(spec, sig_args if sig.immutable else ("0" if errback else None, *sig_args),
                    sig_kwargs)  # fmt: skip
    task_id = sig.options.get("task_id")
    if task_id is not None:
        ids.check_id(task_id, f"{option} {spec.name!r} task_id")
    limit = spec.max_resurrections
    return workflow.Step(
        task=spec.name, id=task_id or uuid.uuid4().hex, args=sig_args,
        kwargs=sig_kwargs, queue=sig.options.get("queue") or spec.queue or "",
        immutable=bool(sig.immutable), version=spec.schema.version,
        priority=_priority(sig.options, spec), limit=flow["limit"],
        limit_key=flow["limit_key"],
        max_resurrections=(
            resurrections.stored(limit, config.current().resurrection_policy())
            if errback else None
        ),
    )  # fmt: skip


def _priority(chosen: Mapping[str, Any], spec: TaskSpec) -> int | None:
    """The priority of a task a commit or a filing creates (a chain's later step, a
    chord's callback, a link's callback or errback): its signature's own
    (``.set(priority=)``), else its task's default."""
    given = chosen.get("priority")
    if given is None:
        return spec.priority
    return options.check_priority(given, f"chain step {spec.name!r} priority")


def _flow(chosen: Mapping[str, Any], spec: TaskSpec, where: str) -> dict[str, str | None]:
    """A step's own flow control (``.set(limit=, concurrency_key=)``) as ``Step``'s
    ``limit`` and ``limit_key``, checked with the push, since a commit creates the step
    later (both None when it gives none).

    Raises:
        TypeError, ValueError: as ``limits.check_call``; a key with no limit to key.
    """
    limit, key = options.call_flow(chosen, where)
    if key is not None and limit is None and not spec.limits:
        raise ValueError(
            f"{where}: concurrency_key={key!r} keys nothing: the task has no concurrency=, "
            "limit= or rate=, and the signature gives no limit="
        )
    return {"limit": limit, "limit_key": key}
