"""Crash-point testing (docs/crash-testing.md): the plugin kills a task's incarnation
at every boundary it crosses, and catches the planted bug of the example checkout
(testproject/demo/checkout.py: a charge outside the inbox unit), naming the boundaries
where the charge doubled; the fixed checkout passes at every boundary.

The worker and the test share a SQLite database (``crashpoints_env``), where the fake
gateway's charges and the orders are rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relier_django.crashpoints import Report
from testproject.demo import checkout
from testproject.shared_db import SharedDatabase

BOUNDARIES = [
    "checkpoint",
    "before inbox commit",
    "after inbox commit",
    "before commit.lua",
    "after commit.lua",
]


@pytest.fixture
def checkout_db(tmp_path: Path) -> Iterator[SharedDatabase]:
    db = SharedDatabase.create("sqlite", tmp_path, None)
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def crashpoints_env(checkout_db: SharedDatabase) -> dict[str, str]:
    return checkout_db.env()


def rows(db: SharedDatabase, label: str) -> Callable[[], int]:
    sql = "SELECT count(*) FROM demo_booking WHERE label = %s"
    return lambda: int(db.query(sql, [label])[0][0])


def effects(db: SharedDatabase, order: str) -> dict[str, Callable[[], int]]:
    return {"charges": rows(db, f"charge:{order}"), "orders": rows(db, f"order:{order}")}


def test_crashpoints_name_each_boundary_where_a_charge_outside_the_unit_doubles(
    crashpoints, checkout_db
):
    report: Report = crashpoints(
        checkout.checkout_planted, "o-planted", effects=effects(checkout_db, "o-planted"),
        check=False,
    )  # fmt: skip

    assert report.boundaries == BOUNDARIES
    assert all(run.killed for run in report.runs[1:])  # every boundary was reached
    assert all(run.commits == 1 and not run.error for run in report.runs)
    doubled = [
        f"effect 'charges' happened 2 times after a kill at {b!r} (expected 1)"
        for b in ("before inbox commit", "after inbox commit", "before commit.lua")
    ]
    assert report.failures == doubled  # the order, in the unit, is never doubled
    with pytest.raises(AssertionError) as raised:
        report.check()
    assert all(line in str(raised.value) for line in doubled)


def test_crashpoints_pass_the_checkout_whose_charge_is_inside_the_unit(crashpoints, checkout_db):
    report: Report = crashpoints(
        checkout.checkout_fixed, "o-fixed", effects=effects(checkout_db, "o-fixed")
    )

    assert report.passed
    assert report.boundaries == BOUNDARIES
    assert all(run.killed for run in report.runs[1:])
    assert [dict(run.effects) for run in report.runs] == [{"charges": 1, "orders": 1}] * 6
    # Six charges and six orders in all: one per run, whatever the kill.
    assert rows(checkout_db, "charge:o-fixed")() == 6


def test_crashpoints_kill_an_async_task_at_its_checkpoint_its_push_and_its_commit(crashpoints):
    report: Report = crashpoints(checkout.checkout_notify, "o-async")

    assert report.boundaries == [
        "checkpoint",
        "push of demo.sync_record",
        "before commit.lua",
        "after commit.lua",
    ]
    assert all(run.killed for run in report.runs[1:])
    assert [run.commits for run in report.runs] == [1] * 5
