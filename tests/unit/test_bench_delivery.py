"""The delivery benchmark's bookkeeping (bench/delivery.py), on made-up starts, kills
and log lines: which kill interrupted which run, the two phases of a recovery, what
counts as a false death, when the faults strike."""

from __future__ import annotations

import time

import pytest

from bench.common import rabbitmq_env
from bench.delivery import (
    CONTENDERS,
    Interruption,
    false_deaths,
    interruptions,
    log_time,
    plot_phases,
    recovery_phases,
    spread,
    timeline,
    unexplained_restarts,
)
from testproject.rabbitmq import RabbitServer

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0  # a whole second, so a log stamp carries it exactly


def _stamp(at: float) -> str:
    """``at`` as the testproject's log time (local, milliseconds)."""
    whole = int(at)
    millis = round((at - whole) * 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole)) + f",{millis:03d}"


def _line(at: float, message: str) -> str:
    return f"{_stamp(at)} WARNING relier_django.resurrector {message}\n"


def test_a_log_stamp_reads_back_as_the_epoch_time_it_was_written_at():
    assert log_time(_stamp(T0 + 12.345)) == pytest.approx(T0 + 12.345, abs=1e-6)


def test_a_run_is_interrupted_by_the_first_kill_after_its_start_that_took_its_process():
    starts = [[(T0, 11), (T0 + 12.0, 22)]]
    kills = [
        (T0 + 1.0, frozenset({33})),  # another process
        (T0 + 3.0, frozenset({10, 11, 12})),  # the whole worker holding 11
        (T0 + 5.0, frozenset({11})),  # 11 already dead
    ]
    assert interruptions(starts, kills) == [Interruption(0, T0 + 3.0, T0 + 12.0, 3)]


def test_a_kill_before_the_run_started_interrupts_nothing():
    starts = [[(T0 + 2.0, 11), (T0 + 4.0, 22)]]
    assert interruptions(starts, [(T0 + 1.0, frozenset({11}))]) == []


def test_a_second_start_no_kill_explains_is_counted_and_an_explained_one_is_not():
    starts = [
        [(T0, 11), (T0 + 5.0, 22)],  # 11 was killed: explained
        [(T0, 12), (T0 + 6.0, 23)],  # 12 lived: a false death's second run
        [(T0, 13)],
    ]
    assert unexplained_restarts(starts, [(T0 + 1.0, frozenset({11}))]) == 1


def test_a_recovery_splits_at_its_first_redispatch_between_the_kill_and_the_next_start():
    cut = [Interruption(0, T0 + 1.0, T0 + 5.0, 1), Interruption(1, T0 + 2.0, T0 + 9.0, 3)]
    logs = (
        _line(T0 + 0.5, "resurrected task_id=aaa task=demo.work fence=2 resurrections=1")
        + _line(T0 + 1.25, "resurrected task_id=aaa task=demo.work fence=2 resurrections=1")
        + _line(T0 + 6.0, "resurrected task_id=bbb task=demo.work fence=2 resurrections=1")
        + _line(T0 + 7.0, "resurrected task_id=bbb task=demo.work fence=3 resurrections=2")
    )
    phases = recovery_phases(cut, ["aaa", "bbb"], logs)
    assert [(round(p.detect, 3), round(p.restart, 3), p.took, p.sends) for p in phases] == [
        (0.25, 3.75, 1, 1),
        (4.0, 3.0, 3, 2),  # sent again: the first re-dispatch never ran
    ]


def test_a_recovery_without_a_redispatch_line_has_no_phases():
    cut = [Interruption(0, T0 + 1.0, T0 + 5.0, 1)]
    late = _line(T0 + 7.0, "resurrected task_id=aaa task=demo.work fence=2 resurrections=1")
    assert recovery_phases(cut, ["aaa"], late) == []


def test_a_holder_found_dead_is_false_unless_a_kill_had_taken_its_process():
    logs = (
        _line(T0 + 3.0, "holder found dead (its connection is gone) worker=w1@host:11")
        + _line(T0 + 3.0, "holder found dead (its connection is gone) worker=w1@host:12")
        + _line(T0 + 4.0, "holder found dead (its connection is gone) worker=w2@host:13")
    )
    kills = [(T0 + 1.0, frozenset({10, 11, 12})), (T0 + 9.0, frozenset({13}))]
    assert false_deaths(logs, kills) == ["w2@host:13"]


def test_faults_strike_evenly_and_the_disruptions_fall_between_kills():
    assert timeline(60.0, 5, disrupt=False) == [(10.0 * k, "kill") for k in range(1, 6)]
    events = timeline(60.0, 5, disrupt=True)
    assert (15.0, "redis-restart") in events and (25.0, "cut") in events
    assert [what for _, what in events].count("kill") == 5
    two = timeline(30.0, 2, disrupt=True)
    kills = [at for at, what in two if what == "kill"]
    assert all(kills[0] < at < kills[1] for at, what in two if what != "kill")


def test_a_spread_without_samples_has_no_percentiles():
    assert spread("restart", []) == {
        "restart_p50_s": None,
        "restart_p99_s": None,
        "restart_latencies_s": [],
    }
    assert spread("restart", [2.0, 1.0, 3.0])["restart_p50_s"] == 2.0


def test_nothing_is_plotted_without_relier_recoveries(tmp_path):
    empty = {f"{k}_latencies_s": [] for k in ("redispatch", "restart", "recovery")}
    results = {"relier/60x2": empty}
    assert plot_phases(results, tmp_path / "x.png") == "no relier recoveries to plot"
    assert not (tmp_path / "x.png").exists()


def test_the_phases_are_plotted_one_panel_each_from_the_undisrupted_relier_rounds(tmp_path):
    samples = {f"{k}_latencies_s": [0.5, 1.0, 1.5] for k in ("redispatch", "restart", "recovery")}
    results = {"relier/60x2": samples, "relier+disrupt/60x2": {}, "acks_late/60x2": {}}
    assert plot_phases(results, tmp_path / "img" / "p.png").startswith("phases plotted")
    assert (tmp_path / "img" / "p.png").stat().st_size > 0


def test_a_contender_moved_to_rabbitmq_keeps_its_settings_on_queues_of_its_own(tmp_path):
    node = RabbitServer(tmp_path)  # never started: its ports and URL are fixed at creation
    _, acks_late = CONTENDERS["acks_late"]
    env = rabbitmq_env(node, "bench-acks_late-500x5", acks_late)
    assert "CELERY_BROKER_TRANSPORT" not in env  # kombu's Redis transport would ignore the URL
    assert env["CELERY_TASK_ACKS_LATE"] == env["CELERY_TASK_REJECT_ON_WORKER_LOST"] == "true"
    assert env["CELERY_BROKER_URL"] == node.url and node.url.startswith("amqp://")
    assert env["CELERY_TASK_DEFAULT_QUEUE_TYPE"] == "quorum"
    assert env["CELERY_TASK_DEFAULT_QUEUE"] == "bench-acks_late-500x5"
    assert env["RELIER_RECOVERY_QUEUE"] == "bench-acks_late-500x5.recovery"
    assert "CELERY_BROKER_TRANSPORT" in acks_late  # the Redis round's own is untouched
