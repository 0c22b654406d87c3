"""Bad input is refused at push, before anything is stored or sent (G6)."""

from __future__ import annotations

import datetime
import random

import pytest

from relier_django.core import producer
from relier_django.core.idempotency import derive_key
from relier_django.core.keys import KeySpace
from relier_django.core.retry import backoff_s
from relier_django.core.spec import TaskSpec


def send_invoice(ctx, invoice_id: str, when=None):
    return invoice_id


SPEC = TaskSpec(name="billing.send_invoice", fn=send_invoice)


def test_a_non_json_argument_is_named_in_the_error():
    with pytest.raises(TypeError, match=r"argument 'when' is a datetime.*JSON"):
        producer.prepare(SPEC, ("inv-1",), {"when": datetime.datetime.now()})


def test_a_call_that_does_not_fit_the_signature_fails_at_push():
    with pytest.raises(TypeError, match=r"billing\.send_invoice: .*unexpected keyword"):
        producer.prepare(SPEC, ("inv-1",), {"whom": 1})


def test_the_context_parameter_is_not_part_of_the_push_signature():
    env = producer.prepare(SPEC, ("inv-1",), {})
    assert env.args == ("inv-1",) and env.fence == 1 and env.attempt == 1


def test_idempotency_keys_are_namespaced_by_task_name():
    keys = KeySpace("rl")
    key = derive_key(None, (1,), {})
    assert keys.idempotency("a.process", key) != keys.idempotency("b.process", key)


def test_default_idempotency_key_does_not_depend_on_kwarg_order():
    assert derive_key(None, (), {"a": 1, "b": 2}) == derive_key(None, (), {"b": 2, "a": 1})


def test_callable_idempotency_key_receives_the_arguments():
    assert derive_key(lambda invoice_id, **_: f"inv:{invoice_id}", ("7",), {}) == "inv:7"
    with pytest.raises(TypeError, match="non-empty str"):
        derive_key(lambda *a: 7, (), {})


def test_backoff_grows_exponentially_is_capped_and_never_zero():
    rng = random.Random(1)
    delays = [backoff_s(n, 1.0, 10.0, rng) for n in range(1, 8)]
    assert all(0.5 <= d <= 1.0 for d in delays[:1])
    assert all(2.0 <= d <= 4.0 for d in delays[2:3])
    assert all(5.0 <= d <= 10.0 for d in delays[4:])
