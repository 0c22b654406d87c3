"""@rl_task under Celery's option names, and apply_async's options (issue 20)."""

from __future__ import annotations

import pytest

from relier_django import rl_task
from relier_django.core.model import options


def test_celery_names_with_the_same_meaning_are_translated():
    got = options.translate(
        {"autoretry_for": (KeyError,), "soft_time_limit": 5, "time_limit": 9,
         "retry_backoff": True, "retry_jitter": True, "acks_late": True, "ignore_result": True},
        (),
    )  # fmt: skip
    assert got == {
        "retry_on": (KeyError,),
        "soft_timeout": 5,
        "hard_timeout": 9,
        "retry_backoff": 1.0,
        "retry_jitter": True,
    }


def test_an_unknown_option_names_the_nearest_one():
    with pytest.raises(TypeError, match=r"unknown option 'idempotnet'.*did you mean 'idempotent'"):
        options.translate({"idempotnet": True}, ("idempotent", "queue"))


def test_a_celery_option_with_another_meaning_says_what_to_do_instead():
    with pytest.raises(TypeError, match=r"'serializer' is not supported.*JSON envelopes"):
        options.translate({"serializer": "pickle"}, ())


def test_celery_s_retry_options_keep_their_meaning():
    """default_retry_delay (self.retry()'s delay), retry_jitter and retry_kwargs
    (retry_on's limit and fixed countdown), as Celery means them (issue 39)."""
    got = options.translate(
        {"default_retry_delay": 3, "retry_jitter": False,
         "retry_kwargs": {"max_retries": 5, "countdown": 2}},
        (),
    )  # fmt: skip
    assert got == {
        "default_retry_delay": 3.0,
        "retry_jitter": False,
        "retry_kwargs": {"max_retries": 5, "countdown": 2.0},
    }
    with pytest.raises(TypeError, match=r"default_retry_delay= takes seconds"):
        options.translate({"default_retry_delay": -1}, ())
    with pytest.raises(TypeError, match=r"retry_kwargs=\{'queue': \.\.\.\} is not supported"):
        options.translate({"retry_kwargs": {"queue": "x"}}, ())
    with pytest.raises(TypeError, match=r"max_retries takes an int"):
        options.translate({"retry_kwargs": {"max_retries": "3"}}, ())


def test_celery_s_retry_options_reach_the_task_spec():
    @rl_task(name="unit.opts.retry", autoretry_for=(KeyError,), default_retry_delay=7,
             retry_jitter=False, retry_kwargs={"max_retries": 1, "countdown": 4})  # fmt: skip
    def job() -> None: ...

    spec = job.relier_spec
    assert spec.default_retry_delay_s == 7.0 and spec.retry_jitter is False
    assert spec.autoretry_max_retries(3) == 1 and spec.autoretry_countdown_s == 4.0


def test_rate_limit_is_celery_s_execution_rate_held_across_workers():
    """Celery's rate_limit= slows execution; relier's rate= does so cluster-wide: the
    same meaning under either name (docs/flow-control.md), one of them at a time."""
    assert options.execution_rate(None, "5/s") == "5/s"
    assert options.execution_rate("5/s", None) == "5/s"
    with pytest.raises(TypeError, match="not both"):
        options.execution_rate("5/s", "5/s")


def test_apply_async_options_it_cannot_honour_are_refused_never_dropped():
    assert options.call_options({"task_id": "t1", "queue": "q", "producer": object(),
                                 "headers": {"celery_beat_task": True}}) == {
        "task_id": "t1", "queue": "q"}  # fmt: skip
    assert options.call_options({"countdown": 5, "eta": None, "expires": 9}) == {
        "countdown": 5, "expires": 9}  # fmt: skip
    # Celery's link= and link_error= pass on to the task's apply_async (test_link.py).
    assert options.call_options({"link": "s", "link_error": None}) == {"link": "s"}
    for name, value, says in (
        ("priority", "9", "an int"),
        ("routing_key", "x", "queue="), ("headers", {"tenant": 1}, "task arguments"),
        ("serializer", "pickle", "JSON"),
    ):  # fmt: skip
        with pytest.raises(TypeError, match=says):
            options.call_options({name: value})


def test_rl_task_takes_celery_names_and_refuses_unknown_ones():
    def fn(x: int) -> int:
        return x

    task = rl_task(fn, name="t.celery_names", autoretry_for=(KeyError,), time_limit=9,
                   soft_time_limit=5, acks_late=True)  # fmt: skip
    spec = task.relier_spec
    assert (spec.retry_on, spec.soft_timeout_s, spec.hard_timeout_s) == ((KeyError,), 5, 9)
    assert (task.soft_time_limit, task.time_limit) == (5, 9)  # Celery's own, for a def task
    with pytest.raises(TypeError, match="under two names"):
        rl_task(fn, name="t.twice", retry_on=(KeyError,), autoretry_for=(KeyError,))
    with pytest.raises(TypeError, match="did you mean 'max_retries'"):
        rl_task(fn, name="t.typo", max_retry=3)


def test_bind_true_gives_the_first_parameter_the_context_whatever_its_name():
    def fn(self, x: int) -> str:
        return f"{self.task_name}:{x}"

    task = rl_task(fn, name="t.bound", bind=True)
    assert task.relier_spec.wants_context
    assert task(2) == "t.bound:2"
