"""Envelopes: canonical, checksummed, and every corruption is caught with a reason."""

from __future__ import annotations

import json

import pytest

from relier_django.core.envelope import Envelope, canonical, decode
from relier_django.core.errors import EnvelopeError

ENV = Envelope(
    id="t1", task="demo.record", args=("a", 1), kwargs={"x": [1, 2]}, queue="q", created_ms=5
)


def test_round_trip_is_exact():
    assert decode(ENV.encode()) == ENV


def test_encoding_is_canonical_whatever_the_key_order():
    assert canonical({"b": 1, "a": [2, {"d": 1, "c": 2}]}) == '{"a":[2,{"c":2,"d":1}],"b":1}'
    same = Envelope(
        created_ms=5, queue="q", kwargs={"x": [1, 2]}, args=("a", 1), task="demo.record", id="t1"
    )
    assert same.encode() == ENV.encode()


def test_a_changed_argument_fails_the_checksum():
    body = json.loads(ENV.encode())
    body["args"] = ["a", 2]
    with pytest.raises(EnvelopeError) as err:
        decode(json.dumps(body))
    assert err.value.reason == "payload_integrity"
    assert err.value.raw == json.dumps(body)


def test_a_changed_fence_fails_the_checksum():
    body = json.loads(ENV.encode())
    body["fence"] = 7
    with pytest.raises(EnvelopeError, match="checksum"):
        decode(json.dumps(body))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe", "malformed_message"),
        ("not json", "malformed_message"),
        ('{"id": "x"}', "malformed_message"),
        (42, "malformed_message"),
        (
            json.dumps({"id": "x", "task": "t", "fence": 1, "v": 99, "sha256": "0"}),
            "schema_migration",
        ),
    ],
)
def test_garbage_is_rejected_with_a_reason_and_its_raw_body(raw, reason):
    with pytest.raises(EnvelopeError) as err:
        decode(raw)
    assert err.value.reason == reason
    assert err.value.raw == raw


def test_next_incarnation_bumps_only_the_fence_and_what_is_asked():
    nxt = ENV.next_incarnation(attempt=2)
    assert (nxt.fence, nxt.attempt, nxt.args, nxt.id) == (2, 2, ENV.args, ENV.id)
