"""Which messages a worker adopts (send_task by name, docs/from-celery.md): Celery's
own messages for an ``@rl_task``, never relier's own, broken or not. Pure."""

from __future__ import annotations

import json

import pytest

from relier_django.core.broker.marker import MARKER_HEADER
from relier_django.core.push import producer
from relier_django.core.worker import adoption
from testproject.demo import tasks

pytestmark = pytest.mark.unit


def test_raw_arguments_without_relier_header_are_adopted():
    assert adoption.is_plain({}, ["label"], {})
    assert adoption.is_plain({}, [], {"label": "x"})
    assert adoption.is_plain({}, ["a", 0.5], {})
    assert adoption.is_plain(None, [42], {})
    assert adoption.is_plain({"other": 1}, ["{not json"], {})


def test_relier_messages_are_never_adopted_even_broken():
    # relier's header: an envelope to verify (broken JSON is dead-lettered, not run).
    assert not adoption.is_plain({MARKER_HEADER: 1}, ["{broken"], {})
    assert not adoption.is_plain({MARKER_HEADER: 1}, ["a", "b"], {})
    # One string that reads as an envelope, header lost: still verified as one.
    env = producer.prepare(tasks.record.relier_spec, ("x",), {})
    assert not adoption.is_plain({}, [env.encode()], {})
    forged = json.dumps({"sha256": "0" * 64, "fence": 1})
    assert not adoption.is_plain({}, [forged], {})


def test_the_adopted_envelope_is_a_first_incarnation_of_the_named_task():
    spec = tasks.sync_record.relier_spec
    env = adoption.envelope_of(spec, "celery-id", ["label"], {"sleep_s": 0.5}, "celery")
    assert (env.id, env.task, env.fence, env.attempt) == ("celery-id", "demo.sync_record", 1, 1)
    assert env.args == ("label",) and env.kwargs == {"sleep_s": 0.5} and env.queue == "celery"
    assert env.schema_version == spec.schema.version and env.created_ms > 0
