"""Envelopes: canonical, checksummed, optionally HMAC-signed, and every corruption is
caught with a reason (G5); decode is tolerant in the documented ways."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from relier_django.core.model import signing
from relier_django.core.model.config import Config
from relier_django.core.model.envelope import FORMAT_VERSION, Envelope, canonical, decode
from relier_django.core.model.errors import ConfigError, EnvelopeError
from relier_django.core.model.signing import Signer, key_id

ENV = Envelope(
    id="t1", task="demo.record", args=("a", 1), kwargs={"x": [1, 2]}, queue="q", created_ms=5
)
NEW = "n" * 40  # test keys: long enough, obviously not secret
OLD = "o" * 40


def with_checksum(body: dict) -> str:
    """What an attacker who can write the broker does: recompute the plain checksum."""
    body = {k: v for k, v in body.items() if k != "sha256"}
    unsigned = {k: v for k, v in body.items() if k != "hmac"}
    body["sha256"] = hashlib.sha256(canonical(unsigned).encode()).hexdigest()
    return json.dumps(body)


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


@pytest.mark.parametrize("signer", [None, Signer([NEW])], ids=["unsigned", "signed"])
def test_an_empty_checksum_on_an_already_parsed_body_is_refused(signer):
    # A body handed over parsed (a dict, not the text as sent) has no bytes to hash
    # the fast way; an empty claimed checksum once matched that empty "nothing".
    body = json.loads(ENV.encode(signer))
    body["args"] = ["a", 1_000_000]
    body["sha256"] = ""
    with pytest.raises(EnvelopeError, match="checksum mismatch") as err:
        decode(body, signer)
    assert err.value.reason == "payload_integrity"


def test_a_message_not_in_canonical_form_still_verifies_the_slow_way():
    # Another producer may re-serialise (spaces, key order): the checksum is over the
    # canonical body, not over the bytes as sent.
    loose = json.dumps(json.loads(ENV.encode()), indent=1)[::-1][::-1]
    assert loose != ENV.encode()
    assert decode(loose) == ENV
    assert decode(ENV.encode().encode()) == ENV  # bytes, as some brokers deliver


def test_a_checksum_member_planted_inside_the_arguments_changes_nothing():
    """The fast path cuts the checksum member out of the message as sent; a copy of it
    planted earlier (inside the arguments) must not let tampered arguments through."""
    wire = ENV.encode()
    claimed = json.loads(wire)["sha256"]
    body = json.loads(wire)
    body["args"] = [{"a": 1, "sha256": claimed}, 1]
    planted = canonical(body)
    assert f',"sha256":"{claimed}"' in planted.split('"fence"')[0]
    with pytest.raises(EnvelopeError) as err:
        decode(planted)
    assert err.value.reason == "payload_integrity"


def test_a_signature_planted_inside_the_arguments_changes_nothing():
    signer = Signer([NEW])
    wire = ENV.encode(signer)
    body = json.loads(wire)
    body["args"] = [{"a": 1, "hmac": body["hmac"]}, 1]
    with pytest.raises(EnvelopeError) as err:
        decode(with_checksum(body), signer)
    assert err.value.reason == "payload_integrity"
    assert decode(wire, signer) == ENV


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


# --- versions and tolerance ------------------------------------------------------------


def test_the_tasks_schema_version_is_carried_apart_from_the_format_version():
    env = Envelope(id="t", task="x", schema_version=3)
    body = json.loads(env.encode())
    assert (body["schema_version"], body["v"]) == (3, 1)  # format 1: no chain
    assert decode(env.encode()).schema_version == 3


def test_only_an_envelope_carrying_a_chain_is_written_in_format_2():
    # An older release refuses format 2 instead of committing a step and dropping the
    # rest of its chain; every other envelope stays format 1, byte for byte.
    plain = Envelope(id="t", task="x")
    assert json.loads(plain.encode())["v"] == 1
    assert "chain" not in plain.encode() and "workflow" not in plain.encode()
    step = {"task": "y", "id": "t2", "args": [], "kwargs": {}, "queue": "", "immutable": False}
    chained = Envelope(id="t", task="x", workflow="t", chain=(step,))
    body = json.loads(chained.encode())
    assert (body["v"], body["workflow"], body["chain"]) == (2, "t", [step])
    assert decode(chained.encode()) == dataclasses.replace(chained, v=2)


def test_an_envelope_carrying_links_is_written_in_format_3_and_read_back_whole():
    # A release that reads format 2 at most (before link=) refuses it, into the DLQ
    # (schema_migration), instead of committing the task and dropping its callbacks.
    step = {"task": "y", "id": "t2", "args": [1], "kwargs": {}, "queue": "", "immutable": True}
    errback = {**step, "id": "t3", "maxres": 2}
    linked = Envelope(id="t", task="x", link=(step,), link_error=(errback,))
    body = json.loads(linked.encode())
    assert (body["v"], body["link"], body["link_error"]) == (3, [step], [errback])
    assert decode(linked.encode()) == dataclasses.replace(linked, v=3)
    assert FORMAT_VERSION == 4
    assert json.loads(Envelope(id="t", task="x", link_error=(errback,)).encode())["v"] == 3
    with pytest.raises(EnvelopeError, match="a link step is not an object") as err:
        decode(with_checksum({**body, "link": ["y"]}))
    assert err.value.reason == "malformed_message"


def test_an_envelope_without_a_schema_version_reads_as_version_1():
    body = json.loads(ENV.encode())
    del body["schema_version"]
    assert decode(with_checksum(body)).schema_version == 1


def test_fields_from_a_newer_release_are_kept_and_written_back():
    body = json.loads(ENV.encode())
    body["urgency"] = {"level": 5}
    env = decode(with_checksum(body))
    assert env.extra == {"urgency": {"level": 5}}
    # A retry or resurrection on this older worker re-emits it, checksummed.
    again = json.loads(env.next_incarnation().encode())
    assert again["urgency"] == {"level": 5}
    assert decode(json.dumps(again)).extra == env.extra


def test_a_newer_envelope_format_says_to_upgrade_relier_django_first():
    body = json.loads(ENV.encode())
    body["v"] = FORMAT_VERSION + 1
    with pytest.raises(
        EnvelopeError,
        match=rf"format v{FORMAT_VERSION + 1} > v{FORMAT_VERSION}.*Upgrade relier_django",
    ) as err:
        decode(with_checksum(body))
    assert err.value.reason == "schema_migration"


@pytest.mark.parametrize(
    ("name", "value"),
    [("args", "a,1"), ("kwargs", [1]), ("fence", True), ("schema_version", 0), ("v", "1")],
)
def test_fields_of_the_wrong_type_are_malformed_even_with_a_good_checksum(name, value):
    body = json.loads(ENV.encode())
    body[name] = value
    with pytest.raises(EnvelopeError) as err:
        decode(with_checksum(body))
    assert err.value.reason == "malformed_message"


# --- signing ----------------------------------------------------------------------------


def test_a_signed_envelope_verifies_and_names_the_newest_key():
    signer = Signer([NEW, OLD])
    raw = ENV.encode(signer)
    assert json.loads(raw)["hmac"]["kid"] == key_id(NEW)
    assert decode(raw, signer) == ENV


def test_tampered_arguments_with_a_recomputed_checksum_fail_the_signature():
    signer = Signer([NEW])
    body = json.loads(ENV.encode(signer))
    body["args"] = ["a", 1_000_000]
    tampered = with_checksum(body)
    decode(tampered)  # the checksum alone is satisfied: that is what signing is for
    with pytest.raises(EnvelopeError, match="HMAC does not match") as err:
        decode(tampered, signer)
    assert err.value.reason == "payload_integrity"
    assert err.value.raw == tampered


def test_an_unsigned_envelope_is_refused_when_keys_are_configured():
    with pytest.raises(EnvelopeError, match=r"not signed.*SIGNING_KEYS") as err:
        decode(ENV.encode(), Signer([NEW]))
    assert err.value.reason == "payload_integrity"


def test_a_stripped_signature_is_refused_too():
    body = json.loads(ENV.encode(Signer([NEW])))
    del body["hmac"]
    with pytest.raises(EnvelopeError, match="not signed"):
        decode(json.dumps(body), Signer([NEW]))


def test_during_a_rollout_unsigned_is_accepted_but_a_bad_signature_never_is():
    rollout = Signer([NEW], accept_unsigned=True)
    assert decode(ENV.encode(), rollout) == ENV
    body = json.loads(ENV.encode(rollout))
    body["args"] = ["evil"]
    with pytest.raises(EnvelopeError, match="HMAC does not match"):
        decode(with_checksum(body), rollout)


def test_rotation_an_old_keys_envelope_verifies_while_the_old_key_is_listed():
    signed_old = ENV.encode(Signer([OLD]))
    assert decode(signed_old, Signer([NEW, OLD])) == ENV
    with pytest.raises(EnvelopeError, match=rf"key id {key_id(OLD)}.*not among") as err:
        decode(signed_old, Signer([NEW]))
    assert err.value.reason == "payload_integrity"
    # Re-encoding (a retry, a resurrection, a release) moves it to the new key.
    assert json.loads(ENV.encode(Signer([NEW, OLD])))["hmac"]["kid"] == key_id(NEW)


def test_without_keys_a_signed_envelope_still_verifies_its_checksum():
    body = json.loads(ENV.encode(Signer([NEW])))
    assert decode(json.dumps(body)) == ENV
    body["args"] = ["changed"]  # checksum not recomputed
    with pytest.raises(EnvelopeError, match="checksum"):
        decode(json.dumps(body))


def test_a_malformed_signature_is_an_integrity_failure():
    body = json.loads(ENV.encode())
    body["hmac"] = "deadbeef"
    with pytest.raises(EnvelopeError, match="signature is malformed") as err:
        decode(json.dumps(body), Signer([NEW]))
    assert err.value.reason == "payload_integrity"


@pytest.mark.parametrize("keys", [("short",), (NEW, "x" * 31)])
def test_short_keys_are_refused_without_printing_them(keys):
    with pytest.raises(ConfigError, match=r"signing_keys\[\d\] is \d+ bytes.*at least 32") as err:
        Config(signing_keys=keys)
    assert keys[-1] not in str(err.value)
    with pytest.raises(ConfigError):
        Signer(keys)


def test_keys_must_be_a_list_of_strings():
    with pytest.raises(ConfigError, match="must be a list"):
        Config(signing_keys=NEW)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"\[0\] must be a string"):
        signing.check_keys([NEW.encode()])


def test_keys_never_appear_in_a_repr():
    cfg = Config(signing_keys=(NEW, OLD))
    for text in (repr(cfg), repr(cfg.signer), str(cfg)):
        assert NEW not in text and OLD not in text
    assert key_id(NEW) in repr(cfg.signer)


def test_no_keys_means_no_signer_and_unsigned_envelopes():
    assert Config().signer is None
    assert "hmac" not in json.loads(ENV.encode(Config().signer))


def test_signing_keys_come_from_the_environment_comma_separated(settings, monkeypatch):
    from relier_django import conf

    settings.RELIER = {}
    monkeypatch.setenv("RELIER_SIGNING_KEYS", f"{NEW}, {OLD}")
    conf.get_config.cache_clear()
    try:
        cfg = conf.get_config()
        assert cfg.signing_keys == (NEW, OLD)
        assert cfg.signer is not None and cfg.signer.key_ids == (key_id(NEW), key_id(OLD))
    finally:
        monkeypatch.delenv("RELIER_SIGNING_KEYS")
        conf.get_config.cache_clear()


def test_nan_in_a_message_is_malformed_not_a_crash_later():
    body = json.loads(ENV.encode())
    body["args"] = [float("nan")]
    with pytest.raises(EnvelopeError) as err:
        decode(json.dumps(body))  # parsing refuses it, whatever the checksum
    assert err.value.reason == "malformed_message"


def test_a_priority_is_carried_by_every_incarnation_and_absent_when_none():
    from relier_django.core.broker.publish import _options

    prioritised = dataclasses.replace(ENV, priority=7)
    env = decode(prioritised.encode())
    assert env.priority == 7 and env.extra == {}
    assert env.next_incarnation(attempt=2).priority == 7  # retry, resurrection, release
    assert _options(env)["priority"] == 7  # every publish sets the message's priority
    assert "priority" not in json.loads(ENV.encode())  # none given: byte for byte as before
    assert "priority" not in _options(ENV)
    body = json.loads(ENV.encode())
    body["priority"] = "high"
    with pytest.raises(EnvelopeError, match="priority"):
        decode(with_checksum(body))


def test_a_push_s_own_limit_rides_in_the_envelope_and_is_absent_when_none():
    plain = Envelope(id="a", task="t")
    assert '"limit' not in plain.encode()
    limited = Envelope(id="a", task="t", limit="sms", limit_key="42")
    back = decode(limited.encode())
    assert (back.limit, back.limit_key) == ("sms", "42")
    assert back.next_incarnation().limit == "sms"  # a retry or resurrection keeps it


def test_a_parent_and_an_expiry_are_carried_by_every_incarnation_and_absent_when_none():
    env = decode(dataclasses.replace(ENV, parent="p-1", expires_ms=1_700_000_000_000).encode())
    assert (env.parent, env.expires_ms, env.extra) == ("p-1", 1_700_000_000_000, {})
    retried = env.next_incarnation(attempt=2)
    assert (retried.parent, retried.expires_ms) == ("p-1", 1_700_000_000_000)
    body = json.loads(ENV.encode())  # none given: byte for byte as before
    assert "parent" not in body and "expires_ms" not in body and body["v"] == ENV.v
    body["expires_ms"] = "soon"
    with pytest.raises(EnvelopeError, match="expires_ms"):
        decode(with_checksum(body))


@pytest.mark.parametrize(
    "nested",
    [
        {"chain": ({"task": "y", "id": "t2"},), "chord": {"id": "g", "index": 0, "callback": {}}},
        {"chain": ({"task": "y", "id": "t2", "link": [{"task": "z", "id": "t3"}]},)},
        {"link": ({"task": "z", "id": "t3", "chord": {"id": "g", "index": 0, "size": 1}},)},
        {"chord": {"id": "g", "index": 0, "callback": {"task": "c", "id": "cb", "chain": []}}},
    ],
    ids=["chain-in-chord", "group-ending-chain", "chord-in-chain", "callback-with-rest"],
)
def test_a_nested_workflow_is_written_in_format_4_and_a_flat_one_as_before(nested):
    # A format-3 reader would drop what the steps nest: it refuses format 4 instead.
    env = Envelope(id="t", task="x", **nested)
    assert json.loads(env.encode())["v"] == 4
    assert decode(env.encode()) == dataclasses.replace(env, v=4)
    flat = Envelope(id="t", task="x", chain=({"task": "y", "id": "t2"},))
    assert json.loads(flat.encode())["v"] == 2
