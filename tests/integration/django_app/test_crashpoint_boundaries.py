"""The boundaries that crash-point testing kills at (docs/crash-testing.md) are crossed
where the docs say: an inbox unit's database commit, before and after it (with the
unit's name), and a push, after it returned (naming the pushed task). The worker's own
boundaries (checkpoint, ``commit.lua``) are proven with a real worker in
``tests/chaos/test_crashpoints.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import transaction

from relier_django.core import crashpoint
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker.context import TaskContext
from relier_django.db.inbox import once
from testproject.demo import tasks
from testproject.demo.models import Booking

Crossed = list[tuple[str, str, str, bool]]


@pytest.fixture
def crossed() -> Iterator[Crossed]:
    """Every boundary crossed while the test runs, and whether a transaction was open
    on the default database at that moment."""
    seen: Crossed = []

    def hook(boundary: str, task: str, detail: str) -> None:
        seen.append((boundary, task, detail, transaction.get_connection().in_atomic_block))

    crashpoint.install(hook)
    try:
        yield seen
    finally:
        crashpoint.install(None)


@pytest.mark.django_db(transaction=True)
def test_an_inbox_unit_crosses_its_boundaries_on_either_side_of_its_commit(crossed):
    ctx = TaskContext("0" * 31 + "2", 1, 1, 0, "tests.crash", "host:1")
    with once(ctx, part="refund") as unit:
        Booking.objects.create(label="unit", fence=1)
        unit.result = "ok"
    assert crossed == [
        (crashpoint.BEFORE_INBOX_COMMIT, "tests.crash", "refund", True),  # still open
        (crashpoint.AFTER_INBOX_COMMIT, "tests.crash", "refund", False),  # committed
    ]
    assert Booking.objects.filter(label="unit").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_unit_found_done_crosses_no_boundary(crossed):
    ctx = TaskContext("0" * 31 + "3", 1, 1, 0, "tests.crash", "host:1")
    with once(ctx) as unit:
        unit.result = "ok"
    crossed.clear()
    with once(TaskContext("0" * 31 + "3", 2, 1, 1, "tests.crash", "host:2")) as again:
        assert again.done
    assert crossed == []


@pytest.mark.django_db(transaction=True)
def test_a_push_crosses_its_boundary_once_it_returned(crossed, redis_client):
    receipt = tasks.sync_record.push_with(on_commit=False).push("crash")
    assert crossed == [(crashpoint.PUSH, "", "demo.sync_record", False)]
    assert redis_client.exists(KeySpace("rl").task(receipt.task_id))  # stored before


def test_a_removed_hook_is_not_called():
    seen: list[str] = []
    crashpoint.install(lambda boundary, task, detail: seen.append(boundary))
    crashpoint.install(None)
    crashpoint.cross(crashpoint.BEFORE_COMMIT, "tests.crash")
    assert seen == []
