"""G5 end to end, the way an operator meets it: a task that keeps failing lands in the
DLQ with its traceback, ``manage.py relier_dlq`` shows it, and once the cause is fixed
a release runs it exactly once more, to success. Real worker, real ``manage.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from relier_django import Receipt, TaskFailed
from relier_django import dlq as django_dlq
from testproject.demo import tasks
from testproject.harness import REPO_ROOT, wait_until, worker_env


def manage(redis_url: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """``manage.py relier_dlq *args`` as an operator runs it, in its own process."""
    done = subprocess.run(
        [sys.executable, "manage.py", "relier_dlq", *args],
        cwd=REPO_ROOT, env=worker_env(redis_url), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode == 0) is ok, done.stdout + done.stderr
    return done


def dead_letter_broken(redis_client, label: str, note: str = "") -> Receipt:
    """Push ``until_fixed`` while ``label`` is broken and wait until it is in the DLQ."""
    redis_client.set(f"demo:broken:{label}", "1")
    receipt = tasks.until_fixed.push(label, note=note)
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=60)
    assert failed.value.reason == "exception"
    return receipt


def runs(redis_client, label: str) -> int:
    return int(redis_client.llen(f"demo:exec:{label}"))


def test_a_fixed_task_released_with_the_command_runs_exactly_once_more(
    redis_server, redis_client, worker
):
    label = "cmd-flow"
    receipt = dead_letter_broken(redis_client, label, note="the config is wrong")
    task_id = receipt.task_id
    entry = django_dlq.store().get(task_id)
    assert entry is not None and entry.reason == "exception"
    assert "ValueError: cmd-flow is broken (the config is wrong)" in entry.data["traceback"]
    assert runs(redis_client, label) == 1

    listing = manage(redis_server.url, "list").stdout
    assert task_id in listing and "demo.until_fixed" in listing
    assert listing.splitlines()[-1] == "1 of 1 entry"
    (summary,) = json.loads(manage(redis_server.url, "list", "--json").stdout)["entries"]
    assert summary["id"] == task_id and summary["reason"] == "exception"
    assert summary["error"] == "ValueError: cmd-flow is broken (the config is wrong)"

    redis_client.delete(f"demo:broken:{label}")  # the operator fixes the cause
    released = manage(redis_server.url, "release", task_id).stdout
    assert released.startswith(f"released {task_id} (fence 1, failed ")
    assert released.endswith(f" UTC) as task {task_id}\n")
    # The release cleared the failed outcome: the same receipt now waits for the new run.
    assert receipt.get(timeout=60) == {"label": label, "runs": 2, "fence": 2}
    assert runs(redis_client, label) == 2  # the failure, then the released run: once
    assert django_dlq.store().size() == 0

    assert manage(redis_server.url, "list").stdout == "The dead-letter queue is empty.\n"
    assert json.loads(manage(redis_server.url, "stats", "--json").stdout)["total"] == 0
    again = manage(redis_server.url, "release", task_id, ok=False)
    assert again.returncode == 1 and "no such entry" in again.stdout


def test_release_all_for_a_task_runs_each_of_its_entries_once(redis_server, redis_client, worker):
    labels = [f"bulk-{i}" for i in range(3)]
    receipts = [dead_letter_broken(redis_client, label) for label in labels]
    ids = [r.task_id for r in receipts]
    other = tasks.explode.push("stays")  # another task's failure: not selected
    with pytest.raises(TaskFailed):
        other.get(timeout=60)
    for label in labels:
        redis_client.delete(f"demo:broken:{label}")

    dry = manage(redis_server.url, "release", "--all", "--task", "demo.until_fixed", "--dry-run")
    assert dry.stdout.splitlines()[-1] == "3 entries would be released (dry run: nothing changed)."
    out = manage(redis_server.url, "release", "--all", "--task", "demo.until_fixed").stdout
    assert sorted(out.splitlines()[:3]) == sorted(f"released {i}" for i in ids)

    wait_until(
        lambda: all(runs(redis_client, label) >= 2 for label in labels), 60, what="the releases"
    )
    for receipt, label in zip(receipts, labels, strict=True):
        outcome = receipt.get(timeout=60)
        assert outcome["runs"] == 2 and outcome["fence"] == 2
        assert runs(redis_client, label) == 2
    remaining = json.loads(manage(redis_server.url, "list", "--json").stdout)["entries"]
    assert [e["id"] for e in remaining] == [other.task_id]
