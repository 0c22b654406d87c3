"""What ``ctx.set_progress`` / ``ctx.update_state`` accept, and how a context that runs
in this process (eager, ``task(...)``) keeps its progress (docs/progress.md). No server:
the stored path is tests/integration/worker/test_progress.py's."""

from __future__ import annotations

import json

import pytest
from celery import states

from relier_django import ProgressTooLarge, TaskContext
from relier_django.core.model import config
from relier_django.core.push.eager import EagerReceipt
from relier_django.core.store import progress
from testproject.demo import progress_tasks


@pytest.fixture
def ctx():
    found = TaskContext.inline("demo.report", "unit-progress")
    yield found
    progress.forget(found.task_id)


def test_update_state_keeps_a_custom_state_and_its_meta(ctx):
    ctx.update_state(state="PROGRESS", meta={"done": 3, "total": 10})
    assert progress.recall(ctx.task_id) == progress.Progress("PROGRESS", {"done": 3, "total": 10})


def test_update_state_without_a_state_reports_started_and_set_progress_progress(ctx):
    ctx.update_state(meta={"step": 1})
    assert progress.recall(ctx.task_id) == progress.Progress("STARTED", {"step": 1})
    ctx.set_progress({"step": 2})
    assert progress.recall(ctx.task_id) == progress.Progress("PROGRESS", {"step": 2})


@pytest.mark.parametrize("state", [*sorted(progress.RESERVED_STATES), "", "X" * 65])
def test_a_state_relier_decides_or_a_malformed_one_is_refused_naming_the_fix(ctx, state):
    with pytest.raises(ValueError, match="PROGRESS"):
        ctx.update_state(state=state, meta={})
    assert progress.recall(ctx.task_id) is None


def test_the_states_relier_decides_are_celery_s_every_built_in_but_started():
    built_in = set(states.ALL_STATES | {states.REJECTED, states.IGNORED})
    assert built_in - {states.STARTED} == progress.RESERVED_STATES


def test_another_task_s_id_is_refused(ctx):
    ctx.update_state(task_id=ctx.task_id, state="PROGRESS", meta=1)  # its own: fine
    with pytest.raises(ValueError, match="its own progress only"):
        ctx.update_state(task_id="someone-else", state="PROGRESS", meta=2)
    assert progress.recall(ctx.task_id).meta == 1


def test_meta_must_be_json_and_within_the_checkpoint_size_limit(ctx):
    with pytest.raises(TypeError, match="JSON"):
        ctx.set_progress({"at": object()})
    limit = config.current().checkpoint_max_bytes
    with pytest.raises(ProgressTooLarge) as raised:
        ctx.set_progress("x" * limit)
    assert raised.value.limit == limit and "CHECKPOINT_MAX_BYTES" in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert progress.recall(ctx.task_id) is None


def test_the_record_holds_state_and_meta_together_as_canonical_json():
    stored = progress.record("PROGRESS", {"b": 1, "a": [1, 2]}, 1000)
    assert stored == '{"meta":{"a":[1,2],"b":1},"state":"PROGRESS"}'
    assert progress.load(stored) == progress.Progress("PROGRESS", {"a": [1, 2], "b": 1})
    assert progress.load("") is None and progress.load("not json") is None
    assert progress.load(json.dumps({"meta": 1})) is None


def test_a_context_not_attached_to_an_incarnation_says_so():
    detached = TaskContext("t", 1, 1, 0, "demo.report", "w:1")
    with pytest.raises(RuntimeError, match="not attached"):
        detached.set_progress({"done": 1})


def test_an_eager_receipt_reads_the_progress_while_running_then_its_outcome(ctx):
    receipt = EagerReceipt.deferred(ctx.task_id, config.current())
    assert (receipt.status, receipt.info) == ("PENDING", None)
    ctx.set_progress({"done": 1}, state="WORKING")
    assert (receipt.status, receipt.info) == ("WORKING", {"done": 1})


def test_remembered_progress_is_bounded():
    for i in range(progress._REMEMBERED + 5):
        progress.remember(f"bound-{i}", progress.record("PROGRESS", i, 100))
    assert progress.recall("bound-0") is None
    assert progress.recall(f"bound-{progress._REMEMBERED + 4}").meta == progress._REMEMBERED + 4
    progress.forget()
    assert progress.recall(f"bound-{progress._REMEMBERED + 4}") is None


def test_update_state_on_the_task_object_is_refused_naming_the_bound_call():
    with pytest.raises(TypeError, match=r"bind=True and call self\.update_state"):
        progress_tasks.steps.update_state(state="PROGRESS", meta={"done": 1})
