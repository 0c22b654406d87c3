"""Bad input is refused at push, before anything is stored or sent (G6)."""

from __future__ import annotations

import collections
import datetime
import enum
import json
import random

import pytest

from relier_django.core.model import arguments
from relier_django.core.model.backoff import backoff_s
from relier_django.core.model.envelope import canonical
from relier_django.core.model.idem_key import derive_key
from relier_django.core.model.spec import TaskSpec
from relier_django.core.push import producer
from relier_django.core.store.keys import KeySpace


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


def record(ctx, data=None, *rest, **extra):
    return data


RECORD = TaskSpec(name="audit.record", fn=record)


def test_a_dict_key_that_is_not_a_str_is_refused_naming_where_it_is():
    # G6: JSON would hand the task {"1": "x"}, and give it the idempotency key of {"1": "x"}.
    with pytest.raises(
        TypeError, match=r"argument 'data' holds the dict key 1 \(int\) at data\[1\]"
    ):
        producer.prepare(RECORD, ({1: "x"},), {})
    with pytest.raises(
        TypeError, match=r"dict key None \(NoneType\) at extra\['meta'\]\[0\]\[None\]"
    ):
        producer.prepare(RECORD, (), {"meta": [{None: 1}]})


def test_a_tuple_arrives_as_a_list_as_in_celery_and_its_contents_are_checked():
    env = producer.prepare(RECORD, ((1, (2, 3)),), {})
    assert json.loads(env.encode())["args"] == [[1, [2, 3]]]
    with pytest.raises(TypeError, match=r"holds the dict key 1 \(int\) at data\[1\]\[0\]\[1\]"):
        producer.prepare(RECORD, ((0, ({1: "x"},)),), {})


def test_nan_and_infinity_are_refused_naming_where_they_are():
    with pytest.raises(
        TypeError, match=r"argument 'data' is the float nan, which JSON cannot carry"
    ):
        producer.prepare(RECORD, (float("nan"),), {})
    with pytest.raises(TypeError, match=r"holds the float -inf at data\['t'\]\[0\]"):
        producer.prepare(RECORD, ({"t": [float("-inf")]},), {})


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_nesting_beyond_the_limit_is_a_type_error_naming_the_argument_not_a_recursion_error():
    producer.prepare(RECORD, (nested(arguments.MAX_ARGUMENT_DEPTH),), {})  # at the limit: fine
    for too_deep in (nested(arguments.MAX_ARGUMENT_DEPTH + 1), nested(3000)):
        with pytest.raises(TypeError, match=r"argument 'data' holds lists or dicts nested more"):
            producer.prepare(RECORD, (too_deep,), {})
    itself: list = []
    itself.append(itself)
    with pytest.raises(TypeError, match=r"argument 'extra' holds .* contains itself"):
        producer.prepare(RECORD, (), {"loop": itself})


def test_what_push_accepts_comes_out_of_json_equal_to_what_went_in():
    class Kind(enum.StrEnum):
        A = "a"

    data = {
        "s": "é",
        "i": 2**70,
        "f": -0.5,
        "b": True,
        "n": None,
        "l": [1, [2, {"x": []}]],
        "enum": Kind.A,
        Kind.A: collections.OrderedDict(k=1),
    }
    env = producer.prepare(RECORD, (data, "r"), {"more": 1})
    assert json.loads(canonical([list(env.args), env.kwargs])) == [[data, "r"], {"more": 1}]
