"""Eager mode's decisions and outcomes, with no server: the producer's Redis clients and
the broker are replaced by ones that fail the test if anything reaches them."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from relier_django import TaskFailed, testing
from relier_django.core.broker import publish
from relier_django.core.model import config
from relier_django.core.model.config import Config
from relier_django.core.model.spec import TaskSpec
from relier_django.core.model.timing import Debounce, timing
from relier_django.core.push import eager, producer


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("an eager or captured push reached Redis or the broker")


@pytest.fixture(autouse=True)
def no_io(monkeypatch) -> Iterator[None]:
    for name in ("sync_client", "async_client"):
        monkeypatch.setattr(producer, name, _unreachable)
    monkeypatch.setattr(publish, "send", _unreachable)
    config.override(Config(redis_url="redis://relier-unit-tests.invalid:1/0"))
    try:
        yield
    finally:
        config.override(None)
        testing.reset()


class FakeTask:
    """What eager mode needs of a Celery task: ``run`` and the request stack."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec, self.requests = spec, []

    def push_request(self, **request: Any) -> None:
        self.requests.append(request)

    def pop_request(self) -> None:
        pass

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.spec.fn(*args, **kwargs)


def app_for(spec: TaskSpec, **conf: bool) -> Any:
    return SimpleNamespace(conf=SimpleNamespace(**conf), tasks={spec.name: FakeTask(spec)})


def test_eager_follows_celery_task_always_eager_or_the_eager_setting():
    on, off = Config(eager=True), Config()
    assert eager.mode(SimpleNamespace(conf=SimpleNamespace()), off) == eager.Mode(False)
    assert eager.mode(SimpleNamespace(conf=SimpleNamespace(task_always_eager=True)), off).eager
    assert eager.mode(SimpleNamespace(conf=SimpleNamespace()), on).eager
    propagating = SimpleNamespace(conf=SimpleNamespace(task_eager_propagates=True))
    assert eager.mode(propagating, off) == eager.Mode(False, False)  # only when eager
    assert eager.mode(propagating, on) == eager.Mode(True, True)


def test_a_pinned_mode_wins_over_the_settings():
    app = SimpleNamespace(conf=SimpleNamespace(task_always_eager=True))
    with testing.eager(propagate=True):
        assert eager.mode(SimpleNamespace(conf=SimpleNamespace()), Config()).propagates
    assert eager.mode(app, Config()) == eager.Mode(True, False)


def test_a_result_comes_back_as_json_would_return_it_and_the_request_names_the_task():
    spec = TaskSpec(name="unit.pair", fn=lambda x: (x, {"k": x}))
    app = app_for(spec, task_always_eager=True)
    receipt = producer.push(spec, app, (1,), {}, task_id="t-1")
    assert receipt.get() == [1, {"k": 1}]  # a tuple arrives as a list, as from a worker
    (request,) = app.tasks["unit.pair"].requests
    assert (request["id"], request["retries"], request["is_eager"]) == ("t-1", 0, True)


def test_a_result_that_is_not_json_fails_as_result_not_serializable():
    spec = TaskSpec(name="unit.obj", fn=lambda: object())
    receipt = producer.push(spec, app_for(spec, task_always_eager=True), (), {})
    with pytest.raises(TaskFailed) as caught:
        receipt.get()
    assert caught.value.reason == "result_not_serializable"


def test_a_result_above_result_max_bytes_fails_as_result_too_large_and_runs_once():
    config.override(Config(redis_url="redis://relier-unit-tests.invalid:1/0", result_max_bytes=100))
    calls: list[int] = []

    def sized(n: int) -> str:
        calls.append(n)
        return "x" * n

    spec = TaskSpec(name="unit.sized", fn=sized)
    app = app_for(spec, task_always_eager=True)
    with pytest.raises(TaskFailed) as caught:
        producer.push(spec, app, (200,), {}).get()
    assert caught.value.reason == "result_too_large" and calls == [200]
    assert "RESULT_MAX_BYTES (100)" in str(caught.value)
    assert producer.push(spec, app, (50,), {}).get() == "x" * 50  # under the bound


def test_retries_take_the_retry_count_from_the_request_and_never_sleep():
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 4:
            raise TimeoutError("slow")
        return len(calls)

    spec = TaskSpec(name="unit.flaky", fn=flaky, retry_on=(TimeoutError,), max_retries=3)
    app = app_for(spec)
    with testing.eager():
        assert producer.push(spec, app, (), {}).get() == 4
    assert [r["retries"] for r in app.tasks["unit.flaky"].requests] == [0, 1, 2, 3]


def test_a_captured_push_is_validated_and_never_sent():
    spec = TaskSpec(name="unit.send", fn=lambda invoice_id: invoice_id)
    with testing.capture_pushes() as captured:
        with pytest.raises(TypeError):
            producer.push(spec, app_for(spec), (), {"whom": 1})
        receipt = producer.push(spec, app_for(spec), ("inv-1",), {}, queue="billing")
    assert [(p.task, p.args, p.queue) for p in captured] == [("unit.send", ("inv-1",), "billing")]
    assert receipt.pending
    captured[0].run()
    assert receipt.get() == "inv-1"
    with pytest.raises(RuntimeError, match="already ran"):
        captured[0].run()


def test_a_debounced_push_runs_at_once_in_eager_mode_like_a_countdown():
    spec = TaskSpec(name="unit.echo", fn=lambda x: x)
    app = app_for(spec, task_always_eager=True)
    when = timing(countdown=30)
    debounce = Debounce(30_000, "k")
    for x in (1, 2):  # nothing is debounced: each runs, as a countdown push would
        receipt = producer.push(spec, app, (x,), {}, when=when, debounce=debounce)
        assert receipt.get() == x


def test_eager_runs_a_limited_task_at_once_and_still_checks_its_limit():
    """Eager mode runs each push inline, in the caller: nothing could wait for a slot
    there, so a limit does not hold (a task over it runs at once), but its options are
    checked as at a real push (docs/flow-control.md, docs/testing.md)."""
    from relier_django.core.model import limits
    from relier_django.core.model.errors import ConfigError

    ran: list[str] = []

    def body(label: str) -> str:
        ran.append(label)
        if label == "outer":  # with one slot, a real push of "inner" would park here
            assert producer.push(spec, app, ("inner",), {}).get() == "inner"
        return label

    spec = TaskSpec(name="unit.one", fn=body, limits=limits.check_options(1, None, None, None))
    app = app_for(spec, task_always_eager=True)
    assert producer.push(spec, app, ("outer",), {}).get() == "outer"
    assert ran == ["outer", "inner"]
    named = TaskSpec(
        name="unit.named", fn=body, limits=limits.check_options(None, None, "nope", None)
    )
    with pytest.raises(ConfigError, match="limit='nope' is not in RELIER"):
        producer.push(named, app_for(named, task_always_eager=True), ("x",), {})
    with pytest.raises(ConfigError, match="limit='nope' is not in RELIER"):
        producer.push(spec, app, ("x",), {}, flow=("nope", None))
    assert ran == ["outer", "inner"]
