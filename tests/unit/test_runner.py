"""The runner's pure parts: what it commits for a result."""

from __future__ import annotations

from relier_django.core.model.config import Config
from relier_django.core.model.failure import Failure, Reason
from relier_django.core.worker.runner import Runner


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_result_nested_too_deep_for_json_is_a_dlq_failure_not_a_recursion_error():
    runner = Runner(None, None, Config(), "w@host:1")
    failed = runner._record(_nested(5_000), fence=1)
    assert isinstance(failed, Failure) and failed.reason is Reason.RESULT_NOT_SERIALIZABLE
    assert failed.exc_type == "RecursionError"


def test_a_committed_record_names_the_fence_that_wrote_it():
    # commit.lua tells a replay of its own call by it (docs/architecture.md, G10).
    record = Runner(None, None, Config(), "w@host:1")._record({"ok": 1}, fence=3)
    assert record == '{"fence":3,"result":{"ok":1},"status":"ok"}'
