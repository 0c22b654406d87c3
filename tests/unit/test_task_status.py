"""How the store's keys read as Celery states (issue 20), and what crosses processes.

``receipt.status_of`` projects a ``snapshot`` of the task read as ``read_status`` reads
it (``Reading.STATE``, one round trip): the result record, the task hash's (state,
attempt, worker, fence), and the DLQ entry's (reason, error, entry, at_ms).
"""

from __future__ import annotations

import json
import pickle

import pytest
from celery.utils.serialization import get_pickleable_exception

from relier_django import TaskFailed
from relier_django.core.model import outcome
from relier_django.core.store.receipt import TaskStatus, status_of
from relier_django.core.store.snapshot import Reading, _snapshot


def _status(task_id: str, replies: list) -> TaskStatus:  # type: ignore[type-arg]
    """The status of the replies ``read_status``'s one MULTI gets."""
    return status_of(_snapshot(task_id, Reading.STATE, replies))


NO_TASK = [None, None, None, None, None]
NO_ENTRY = [None, None, None, None]


def test_a_committed_result_reads_success_with_the_result():
    status = _status("t", [outcome.succeeded({"a": 1}, 3), NO_TASK, NO_ENTRY])
    assert (status.state, status.result, status.known) == ("SUCCESS", {"a": 1}, True)


def test_a_dead_lettered_task_reads_failure_with_task_failed_and_its_traceback():
    entry = ["exception", "ValueError: x", json.dumps({"traceback": "Traceback ..."}), "1700"]
    record = outcome.failed("exception", "ValueError: x", "t")
    status = _status("t", [record, NO_TASK, entry])
    assert status.state == "FAILURE" and isinstance(status.result, TaskFailed)
    assert (status.result.reason, status.result.error) == ("exception", "ValueError: x")
    assert (status.traceback, status.done_ms) == ("Traceback ...", 1700)


def test_a_dlq_entry_reads_failure_after_the_result_expired():
    entry = ["hard_timeout", "HardTimeout: ran longer", json.dumps({"traceback": None}), "5"]
    status = _status("t", [None, NO_TASK, entry])
    assert status.state == "FAILURE" and status.result.reason == "hard_timeout"


@pytest.mark.parametrize(
    ("task", "state"),
    [
        (["queued", "1", None, "1", None], "PENDING"),
        (["queued", "2", None, "2", None], "RETRY"),  # waiting for the attempt after a failure
        (["handoff", "1", "w:1", "1", None], "PENDING"),  # waiting for its resurrection
        (["running", "1", "w@h:42", "3", None], "STARTED"),
    ],
)
def test_an_unfinished_task_reads_pending_retry_or_started(task, state):
    status = _status("t", [None, task, NO_ENTRY])
    assert status.state == state and status.known


def test_a_started_task_names_its_worker_attempt_and_fence():
    status = _status("t", [None, ["running", "2", "w@h:42", "3", None], NO_ENTRY])
    assert status.result == {"hostname": "w@h:42", "attempt": 2, "fence": 3}


PROGRESS = '{"meta":{"done":3,"total":10},"state":"PROGRESS"}'


def test_a_running_task_that_reported_progress_reads_its_state_with_its_meta():
    status = _status("t", [None, ["running", "1", "w@h:42", "3", PROGRESS], NO_ENTRY])
    assert (status.state, status.result) == ("PROGRESS", {"done": 3, "total": 10})


@pytest.mark.parametrize(("state", "attempt", "named"), [("queued", "1", "PENDING"),
                                                         ("queued", "2", "RETRY")])  # fmt: skip
def test_a_task_waiting_for_its_next_incarnation_reads_as_waiting_whatever_it_reported(
    state, attempt, named
):
    # Kept for the next incarnation (G2: stored by a fence that ran); not a running state.
    status = _status("t", [None, [state, attempt, None, "2", PROGRESS], NO_ENTRY])
    assert (status.state, status.result) == (named, None)


def test_an_id_the_store_does_not_know_reads_pending_and_unknown():
    status = _status("t", [None, NO_TASK, NO_ENTRY])
    assert (status.state, status.known) == ("PENDING", False)


def test_task_failed_crosses_processes_whole():
    """Celery pickles a task's exception to its main process and signal handlers."""
    exc = TaskFailed("t", "exception", "ValueError: x")
    for crossed in (pickle.loads(pickle.dumps(exc)), get_pickleable_exception(exc)):
        assert type(crossed) is TaskFailed
        assert (crossed.task_id, crossed.reason, crossed.error) == (
            "t",
            "exception",
            "ValueError: x",
        )
