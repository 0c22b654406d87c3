"""The chaos runner (docs/chaos.md): every scenario, small, holds every invariant; and the
invariant checker is not vacuous (fabricated violations are reported as failures).

Each scenario runs as ``python -m chaos run <name> --tasks small`` in a subprocess,
exactly as a user runs it: a private Redis of its own, real prefork workers, the
standalone resurrector, real signals. About 10-20 s each; rabbitmq-delivery, which
also starts a private RabbitMQ node and crashes it, about 40 s; cluster-delivery, which
also starts a private Redis Cluster (6 nodes) and fails a master over, about 25 s.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kombu import Connection, Producer, Queue

from chaos import SCENARIOS
from chaos.evidence import (
    DlqRecord,
    Evidence,
    Execution,
    LogEvent,
    Pushed,
    parse_log_line,
    rabbit_queued,
)
from chaos.invariants import check, passed
from chaos.report import Report
from chaos.scenarios.common import stale_incarnation_checks
from relier_django.core.observe.audit import Audit, Unexplained
from testproject.harness import REPO_ROOT

SHARED_INVARIANTS = [
    "pushed = committed once + in DLQ with a reason",
    "lost = 0",
    "committed twice = 0",
    "every outcome is the expected one",
    "every commit is a recorded execution's, at its fence",
    "false deaths = 0 (a live process declared dead)",
    "leaked keys = 0 after the drain",
    "relier_audit: unexplained = 0",
    "nothing in flight, queues empty",
]
# Scenarios whose fault is injected by the runner (poison and slow-task bring their own).
INJECTED = {
    "worker-kill", "zombie", "graceful-deploy", "network-partition", "redis-restart",
    "redis-failover", "task-corrupt", "load-spike", "scheduled-kills", "scheduled-redis-restart",
    "periodic-leader-kill", "workflows", "rabbitmq-delivery", "cluster-delivery",
}  # fmt: skip


def run_chaos(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m chaos ...``; on a timeout it gets SIGTERM first, so that it stops
    every process it started before it goes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"python -m chaos {' '.join(args)} timed out:\n{out}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_list_names_every_scenario_with_a_description():
    result = run_chaos("list", timeout_s=60)
    assert result.returncode == 0, result.stdout
    for name, scenario in SCENARIOS.items():
        assert f"{name}  " in result.stdout and scenario.summary in result.stdout


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_scenario_holds_every_invariant(name: str, tmp_path: Path):
    report_path = tmp_path / "report.json"
    result = run_chaos("run", name, "--tasks", "small", "--seed", "11", "--json", str(report_path))
    assert result.returncode == 0, result.stdout
    assert f"RESULT {name}: PASS" in result.stdout
    (report,) = json.loads(report_path.read_text())
    assert report["ok"] and report["error"] is None
    names = [c["name"] for c in report["checks"]]
    assert names[: len(SHARED_INVARIANTS)] == SHARED_INVARIANTS
    assert len(names) > len(SHARED_INVARIANTS), "every scenario adds checks of its own"
    assert all(c["ok"] for c in report["checks"]), result.stdout
    if name in INJECTED:
        assert report["faults"], result.stdout
    assert "time to quiescence" in report["timings"]


def test_the_rabbitmq_reading_sees_a_ready_and_an_unacknowledged_message_at_once(rabbit_server):
    """rabbitmq-delivery's quiescence and "queues empty" read the node live, where
    ``rabbitmqctl list_queues`` would show a quorum queue's messages seconds late."""
    queue = Queue("chaos-reading", queue_arguments={"x-queue-type": "quorum"})
    with Connection(rabbit_server.url) as conn:
        channel = conn.channel()
        queue(channel).declare()
        try:
            Producer(channel).publish({"n": 1}, routing_key=queue.name, delivery_mode=2)
            reading = rabbit_queued(rabbit_server, [queue.name])
            assert reading == {"chaos-reading ready": 1, "unacked on the node": 0}
            message = channel.basic_get(queue.name, no_ack=False)
            reading = rabbit_queued(rabbit_server, [queue.name])
            assert reading == {"chaos-reading ready": 0, "unacked on the node": 1}
            channel.basic_ack(message.delivery_tag)
            assert rabbit_queued(rabbit_server, [queue.name, "never-declared"]) == {
                "chaos-reading ready": 0,
                "never-declared ready": 0,
                "unacked on the node": 0,
            }
        finally:
            channel.queue_delete(queue.name)


# -- the checker is not vacuous ------------------------------------------------------------
def clean_evidence() -> Evidence:
    """Three tasks: two committed once (one after a resurrection), one in the DLQ."""
    pushed = {
        "a": Pushed("a", "la", "demo.chaos_step"),
        "b": Pushed("b", "lb", "demo.chaos_step"),
        "c": Pushed("c", "lc", "demo.chaos_slow", expect="hard_timeout"),
    }
    ok = {"status": "ok", "result": {"fence": 1}}
    return Evidence(
        pushed=pushed,
        executions=[
            Execution("start", "a", 1, 10, "w1", 1.0),
            Execution("end", "a", 1, 10, "w1", 1.5),
            Execution("start", "b", 1, 11, "w1", 1.0),  # killed mid-run
            Execution("start", "b", 2, 12, "w2", 4.0),
            Execution("end", "b", 2, 12, "w2", 4.5),
            Execution("start", "c", 1, 13, "w2", 1.0),
        ],
        log_events=[
            LogEvent("committed", "a", 1, "worker-w1.log"),
            LogEvent("committed", "b", 2, "worker-w2.log"),
        ],
        outcomes={
            "a": ok,
            "b": {"status": "ok", "result": {"fence": 2}},
            "c": {"status": "failed", "reason": "hard_timeout"},
        },
        dlq={"c": DlqRecord("c", "c", "hard_timeout", 1, {"step": 3})},
        kept_keys={"rl:r:{*}": 3},
        in_flight={"expiry index": 0, "task hashes": 0},
        queued={"celery": 0, "unacked": 0},
    )


def failed_checks(ev: Evidence) -> set[str]:
    return {c.name for c in check(ev) if not c.ok}


def test_the_checker_passes_a_clean_record():
    assert passed(check(clean_evidence())), check(clean_evidence())


def test_the_checker_reports_a_double_commit():
    ev = clean_evidence()
    # A zombie's commit at fence 1 got through beside the resurrected one's at fence 2.
    ev.log_events.append(LogEvent("committed", "b", 1, "worker-w1.log"))
    assert failed_checks(ev) == {
        "pushed = committed once + in DLQ with a reason",
        "committed twice = 0",
    }
    report = Report("fabricated", "a double commit", 0, 3, 1, checks=check(ev))
    assert not report.ok and "FAIL  committed twice = 0" in report.render()


def test_the_checker_reports_a_lost_task():
    ev = clean_evidence()
    ev.log_events = [e for e in ev.log_events if e.task_id != "a"]
    ev.outcomes["a"] = None  # no commit, no DLQ entry: lost
    assert failed_checks(ev) == {"pushed = committed once + in DLQ with a reason", "lost = 0"}


def test_the_checker_reports_a_commit_beside_a_dlq_entry_and_a_wrong_reason():
    ev = clean_evidence()
    ev.log_events.append(LogEvent("committed", "c", 1, "worker-w2.log"))
    assert "committed twice = 0" in failed_checks(ev)
    ev = clean_evidence()
    ev.dlq["c"] = DlqRecord("c", "c", "exception", 1)
    assert failed_checks(ev) == {"every outcome is the expected one"}


def test_the_checker_reports_a_result_no_execution_produced():
    ev = clean_evidence()
    ev.outcomes["b"] = {"status": "ok", "result": {"fence": 1}}  # fence 1 never ended
    assert "every commit is a recorded execution's, at its fence" in failed_checks(ev)


def test_the_checker_reports_leaked_keys_and_work_left_in_flight():
    ev = clean_evidence()
    ev.leaked_keys = ["rl:t:{a}"]
    ev.keys_without_ttl = ["rl:r:{b}"]
    ev.queued["unacked"] = 1
    assert failed_checks(ev) == {
        "leaked keys = 0 after the drain",
        "nothing in flight, queues empty",
    }


def test_the_checker_reports_what_relier_audit_cannot_explain():
    ev = clean_evidence()
    ev.audit = Audit(0, 0, 1000, 3, {"committed": 2}, {}, {}, 1, [Unexplained("a", 0, "gone")])
    assert failed_checks(ev) == {"relier_audit: unexplained = 0"}
    ev.audit = Audit(0, 0, 1000, 3, {"committed": 2, "dead_lettered": 1}, {}, {}, 0)
    assert passed(check(ev))


def test_the_checker_reports_a_live_process_declared_dead():
    ev = clean_evidence()
    ev.log_events.append(LogEvent("found_dead", "w2@relier-chaos:12", 12, "worker-w1.log"))
    assert passed(check(ev))  # a real death: its process is gone
    ev.found_dead_alive = ["w2@relier-chaos:12"]
    assert failed_checks(ev) == {"false deaths = 0 (a live process declared dead)"}


def test_a_found_dead_log_line_names_the_worker_and_its_pid():
    line = (
        "2026-11-25 13:00:00,000 WARNING relier_django.resurrector holder found dead "
        "(its connection is gone) worker=w2@relier-chaos:4242"
    )
    event = parse_log_line(line, "worker-w1.log")
    assert event == LogEvent("found_dead", "w2@relier-chaos:4242", 4242, "worker-w1.log")


def test_a_zombie_commit_fails_the_stale_incarnation_checks():
    ev = clean_evidence()
    held = {"b": 1}  # b was running at fence 1 on the paused worker
    ev.log_events.append(LogEvent("stale_commit", "b", 1, "worker-w1.log"))
    assert all(c.ok for c in stale_incarnation_checks(held, "worker-w1.log", "w1")(ev))
    ev.log_events.append(LogEvent("committed", "b", 1, "worker-w1.log"))
    failed = [c.name for c in stale_incarnation_checks(held, "worker-w1.log", "w1")(ev) if not c.ok]
    assert failed == ["the stale incarnations on w1 committed nothing"]


def test_a_dashed_task_id_is_read_from_the_log_as_a_hex_one():
    # A workflow's later steps carry Celery's dashed ids: their commits count too.
    task_id = "1f88a1d7-0c65-466b-a2c3-4f043c66f830"
    line = f"2026-11-25 20:00:00,000 INFO relier_django.runner committed task_id={task_id} fence=2"
    event = parse_log_line(line, "w1.log")
    assert event is not None
    assert (event.kind, event.task_id, event.fence) == ("committed", task_id, 2)
