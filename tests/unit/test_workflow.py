"""The successor a committing chain step builds (core/model/workflow.py): the result as
its first argument (not for an immutable step), fence 1, the workflow's id, the rest of
the chain; the last step has none; a malformed step is refused, never half-read."""

from __future__ import annotations

import pytest

from relier_django.core.model.envelope import Envelope
from relier_django.core.model.workflow import (
    Step,
    chain_of,
    errbacks,
    following,
    linked,
    opened_chords,
    planned,
    successor,
)


def _first(*steps: Step) -> Envelope:
    return Envelope(id="s1", task="t.a", workflow="s1", chain=chain_of(steps), trace={"x": "1"})


def test_the_successor_takes_the_result_first_and_carries_the_rest():
    env = _first(Step("t.b", "s2", args=(5,), version=2), Step("t.c", "s3"))
    nxt = successor(env, {"n": 1}, created_ms=7)
    assert nxt is not None
    assert (nxt.id, nxt.task, nxt.args, nxt.fence, nxt.created_ms) == (
        "s2",
        "t.b",
        ({"n": 1}, 5),
        1,
        7,
    )
    assert (nxt.workflow, nxt.schema_version, nxt.trace) == ("s1", 2, {"x": "1"})
    assert [s["id"] for s in nxt.chain] == ["s3"]
    last = successor(nxt, 2, created_ms=8)
    assert last is not None and last.chain == () and successor(last, 3, created_ms=9) is None


def test_an_immutable_step_gets_only_its_own_arguments():
    nxt = successor(_first(Step("t.b", "s2", args=(1,), kwargs={"k": 2}, immutable=True)), 99, 1)
    assert nxt is not None and (nxt.args, nxt.kwargs) == ((1,), {"k": 2})


@pytest.mark.parametrize(
    "raw", [{"task": "t.b"}, {"task": 1, "id": "s2"}, {"task": "t.b", "id": ""}]
)
def test_a_malformed_step_is_refused(raw):
    env = Envelope(id="s1", task="t.a", workflow="s1", chain=(raw,))
    with pytest.raises(ValueError, match="malformed"):
        successor(env, 1, 1)


def test_callbacks_take_the_result_first_and_errbacks_the_failed_id_each_a_task_of_its_own():
    # Celery's link= and link_error= (docs/workflows.md#links): never a chain's step.
    env = Envelope(
        id="p1", task="t.a", trace={"x": "1"}, workflow="p1",
        chain=chain_of([Step("t.next", "s2")]),
        link=chain_of([Step("t.cb", "c1", args=(5,)),
                       Step("t.cb", "c2", args=(7,), immutable=True)]),
        link_error=chain_of([Step("t.eb", "e1", max_resurrections=4)]),
    )  # fmt: skip
    first, second = linked(env, {"n": 1}, created_ms=9)
    assert (first.id, first.args, first.created_ms, first.trace) == (
        "c1",
        ({"n": 1}, 5),
        9,
        env.trace,
    )
    assert (second.id, second.args) == ("c2", (7,))
    assert (first.workflow, first.chain, first.link, first.link_error) == ("", (), (), ())
    assert first.push != second.push  # each creation a push of its own, the same if rebuilt
    assert linked(env, {"n": 1}, created_ms=9)[0].push == first.push
    ((errback, limit),) = errbacks(env, created_ms=9)
    assert (errback.id, errback.args, limit) == ("e1", ("p1",), 4)
    assert Step.from_wire(Step("t.eb", "e1").wire()).max_resurrections is None
    assert "maxres" not in Step("t.eb", "e1").wire()  # a chain's step is written as before


def test_a_malformed_link_is_refused():
    env = Envelope(id="p1", task="t.a", link=({"id": "c1"},), link_error=({"task": "t"},))
    with pytest.raises(ValueError, match="malformed"):
        linked(env, 1, created_ms=1)
    with pytest.raises(ValueError, match="malformed"):
        errbacks(env, created_ms=1)


def test_a_step_created_later_keeps_its_signatures_priority():
    env = Envelope(
        id="head", task="t.head", workflow="head",
        chain=(Step(task="t.next", id="next", priority=7).wire(),),
        link=(Step(task="t.cb", id="cb", priority=2).wire(),),
    )  # fmt: skip
    assert successor(env, 1, 0).priority == 7  # type: ignore[union-attr]
    assert [cb.priority for cb in linked(env, 1, 0)] == [2]
    assert "priority" not in Step(task="t", id="x").wire()  # none: the wire as before
    with pytest.raises(ValueError, match="malformed"):
        Step.from_wire({"task": "t", "id": "x", "priority": "9"})


def test_a_chain_in_a_chords_header_counts_only_its_last_steps_commit():
    place = {"id": "g1", "index": 2, "callback": Step("t.sum", "cb").wire()}
    env = Envelope(
        id="s1", task="t.a", workflow="s1", chain=chain_of([Step("t.b", "s2")]), chord=place
    )
    made = following(env, 1, created_ms=5)
    # The first step's commit creates its successor and counts nothing for the chord.
    assert made is not None and made.chord is None and made.env.id == "s2"
    assert made.env.chord == place  # its place passes on to the chain's last step
    assert made.env.parent == "s1"  # Celery's parent_id: the step whose commit made it
    last = following(made.env, 2, created_ms=6)
    assert last is not None and (last.chord, last.index, last.env.id) == ("g1", 2, "cb")
    assert last.env.parent == "s2"  # the member whose commit completed the header


def test_a_step_carries_its_callbacks_to_its_envelope():
    member = Step("t.m", "m1").wire()
    env = _first(Step("t.b", "s2", link=(member,)))
    nxt = successor(env, 4, created_ms=1)
    assert nxt is not None and nxt.link == (member,)
    assert Step.from_wire(Step("t.b", "s2", link=(member,)).wire()).link == (member,)
    assert [(c.id, c.args, c.parent) for c in linked(nxt, 6, created_ms=2)] == [("m1", (6,), "s2")]


def test_a_chord_inside_a_chain_is_opened_by_the_step_before_its_group():
    then = Step("t.after", "s9").wire()
    callback = Step("t.sum", "cb", chain=(then,))
    place = {"id": "g1", "size": 2, "callback": callback.wire()}
    members = [Step("t.m", f"m{i}", chord={**place, "index": i}).wire() for i in range(2)]
    env = _first(Step("t.b", "s2", link=tuple(members)))
    step = successor(env, 1, created_ms=1)
    assert step is not None and opened_chords(step) == {"g1": 2} and opened_chords(env) == {}
    created = linked(step, 5, created_ms=2)
    # Each member takes the step's result first and its place in the header.
    assert [(m.id, m.args, m.chord["index"], m.workflow) for m in created] == [
        ("m0", (5,), 0, "g1"), ("m1", (5,), 1, "g1"),
    ]  # fmt: skip
    made = following(created[1], 7, created_ms=3)
    assert made is not None and made.env.id == "cb" and [s["id"] for s in made.env.chain] == ["s9"]
    assert planned(env.chain) == [("s2", "t.b"), ("m0", "t.m"), ("cb", "t.sum"), ("s9", "t.after"),
                                  ("m1", "t.m")]  # fmt: skip
    with pytest.raises(ValueError, match="malformed"):
        opened_chords(_first_with_link({"task": "t.m", "id": "m", "chord": {"id": "g"}}))


def _first_with_link(raw):
    return Envelope(id="s1", task="t.a", link=(raw,))
