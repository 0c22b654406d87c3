"""The post-commit send's retry bound and its last resort, on a fake clock (no server).

The same paths against real Redis, brokers and workers:
tests/integration/django_app/test_on_commit.py.
"""

from __future__ import annotations

import logging

import pytest

from relier_django.core.model.config import Config
from relier_django.core.model.envelope import Envelope
from relier_django.core.model.errors import AdmissionRejected
from relier_django.core.push import aftercommit
from relier_django.core.store.receipt import Receipt


class FakePush:
    """Stands in for producer._Push: each send_now() takes the next outcome."""

    def __init__(self, *outcomes: BaseException | Receipt) -> None:
        self.cfg = Config(redis_url="redis://127.0.0.1:1/0")
        self.env = Envelope(id="t1", task="demo.record", args=("x",))
        self.encoded = self.env.encode()
        self.outcomes = list(outcomes)
        self.calls = 0

    def send_now(self, app: object, client: object) -> Receipt:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def deliver(p: FakePush, t: FakeTime, budget_s: float = 5.0) -> Receipt:
    receipt = Receipt.deferred(p.env.id, p.cfg)
    aftercommit.deliver(p, None, receipt, budget_s=budget_s, clock=t.clock, sleep=t.sleep)
    return receipt


@pytest.fixture
def errors(caplog):
    logger = logging.getLogger("relier_django")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_errors_are_retried_with_growing_pauses_until_it_goes_through():
    t = FakeTime()
    ok = Receipt("t1", False, Config())
    p = FakePush(ConnectionError("down"), ConnectionError("down"), ok)
    assert deliver(p, t).dispatched
    assert t.pauses == [0.1, 0.2] and p.calls == 3


def test_a_duplicate_found_at_commit_settles_the_receipt_with_the_holder():
    receipt = deliver(FakePush(Receipt("holder", True, Config())), FakeTime())
    assert receipt.deduplicated and receipt.duplicate_of == "holder" and receipt.task_id == "t1"


def test_it_gives_up_before_a_pause_would_end_past_the_budget_and_logs_the_envelope(errors):
    t = FakeTime()
    p = FakePush(*[ConnectionError("down")] * 50)
    receipt = deliver(p, t)
    assert receipt.send_failed and receipt.error == "ConnectionError: down"
    assert sum(t.pauses) <= 5.0 and sum(t.pauses) + 1.0 > 5.0  # pauses capped at 1 s
    assert t.pauses[:5] == [0.1, 0.2, 0.4, 0.8, 1.0]
    [line] = [r.getMessage() for r in errors.records if r.levelno == logging.ERROR]
    assert line.endswith(f"envelope={p.encoded}")
    assert f"attempt={p.calls}" in line


def test_admission_waits_for_retry_after_and_gives_up_at_once_when_it_is_too_long(errors):
    t = FakeTime()
    ok = Receipt("t1", False, Config())
    assert deliver(FakePush(AdmissionRejected("demo.record", 0.7), ok), t).dispatched
    assert t.pauses == [0.7]

    t = FakeTime()
    receipt = deliver(FakePush(AdmissionRejected("demo.record", 59.0)), t)
    assert receipt.send_failed and t.pauses == []  # no wait that cannot end within the budget


def test_an_interrupt_during_a_pause_still_logs_the_envelope_then_propagates(errors):
    t = FakeTime()

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    t.sleep = interrupted  # type: ignore[method-assign]
    p = FakePush(ConnectionError("down"))
    receipt = Receipt.deferred(p.env.id, p.cfg)
    with pytest.raises(KeyboardInterrupt):
        aftercommit.deliver(p, None, receipt, clock=t.clock, sleep=t.sleep)
    assert receipt.send_failed and receipt.error.startswith("KeyboardInterrupt")
    assert f"envelope={p.encoded}" in errors.text


def test_a_receipt_settles_once():
    receipt = deliver(FakePush(Receipt("t1", False, Config())), FakeTime())
    with pytest.raises(RuntimeError, match="already dispatched"):
        receipt.settle(receipt._dispatch)
