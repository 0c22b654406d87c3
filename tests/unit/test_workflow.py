"""The successor a committing chain step builds (core/model/workflow.py): the result as
its first argument (not for an immutable step), fence 1, the workflow's id, the rest of
the chain; the last step has none; a malformed step is refused, never half-read."""

from __future__ import annotations

import pytest

from relier_django.core.model.envelope import Envelope
from relier_django.core.model.workflow import Step, chain_of, successor


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
