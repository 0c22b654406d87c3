"""Trace context in the envelope: carried through encode/decode and every later
incarnation, and absent from an untraced envelope, whose bytes and checksum are what
they were before the field existed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from relier_django.core.model import tracing
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.errors import EnvelopeError
from relier_django.core.model.signing import Signer

TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=1",
}
ENV = Envelope(
    id="t-1", task="demo.record", args=("a", 2), kwargs={"sleep_s": 0.5}, queue="q",
    fence=3, attempt=2, resurrections=1, created_ms=1700000000000, schema_version=2,
)  # fmt: skip
# ENV.encode() as written by the release before Envelope.trace existed.
BEFORE = (
    '{"args":["a",2],"attempt":2,"created_ms":1700000000000,"fence":3,"id":"t-1",'
    '"idem_key":null,"kwargs":{"sleep_s":0.5},"queue":"q","resurrections":1,'
    '"schema_version":2,'
    '"sha256":"f9d8ab0d392bc2ed09128a6e4ba4737d6b4a8c4ba617f4044e383fc8bace9b79",'
    '"task":"demo.record","v":1}'
)


def test_an_untraced_envelope_encodes_exactly_as_before_the_field_existed():
    assert ENV.trace == {}
    assert ENV.encode() == BEFORE
    assert decode(BEFORE) == ENV


def test_a_traced_envelope_round_trips_its_context():
    traced = Envelope(**{**_fields(ENV), "trace": TRACE})
    encoded = traced.encode()
    assert json.loads(encoded)["trace"] == TRACE
    back = decode(encoded)
    assert back == traced
    assert back.trace == TRACE and back.extra == {}  # a known field, not a pass-through


@pytest.mark.parametrize("signer", [None, Signer(["k" * 40])], ids=["unsigned", "signed"])
def test_a_traced_envelope_is_covered_by_its_checksum_and_signature(signer):
    traced = Envelope(**{**_fields(ENV), "trace": TRACE})
    assert decode(traced.encode(signer), signer) == traced
    body = json.loads(traced.encode(signer))
    body["trace"]["traceparent"] = body["trace"]["traceparent"][:-2] + "00"  # sampled off
    with pytest.raises(EnvelopeError) as refused:
        decode(json.dumps(body), signer)
    assert refused.value.reason == "payload_integrity"


def test_every_later_incarnation_keeps_the_trace_context():
    traced = Envelope(**{**_fields(ENV), "trace": TRACE})
    retried = traced.next_incarnation(attempt=traced.attempt + 1)
    assert retried.trace == TRACE and retried.fence == 4
    assert decode(retried.encode()).trace == TRACE


def test_without_a_span_in_progress_nothing_is_injected_and_no_push_span_is_made():
    assert tracing.inject() == {}
    with tracing.push_span("demo.record"):
        assert tracing.inject() == {}
    with tracing.run_span(ENV):  # no context in the envelope: a no-op span at most
        pass


def test_a_run_builds_no_span_while_no_tracer_is_configured(monkeypatch):
    """OpenTelemetry's default provider records nothing: with no context to carry, the
    run skips the span altogether; once an SDK provider is set, it makes one."""
    from opentelemetry import trace

    made: list[str] = []

    class Provider(trace.TracerProvider):  # stands for an SDK's provider
        def get_tracer(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            made.append("tracer")
            return trace.NoOpTracer()

    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(trace, "get_tracer", lambda *a, **k: made.append("tracer"))
    with tracing.run_span(ENV):
        pass
    assert made == []
    sdk = Provider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: sdk)
    monkeypatch.setattr(trace, "get_tracer", lambda *a, **k: sdk.get_tracer(*a, **k))
    with tracing.run_span(ENV):
        pass
    assert made == ["tracer"]


def _fields(env: Envelope) -> dict:
    return {name: getattr(env, name) for name in env.__dataclass_fields__}


def test_without_opentelemetry_installed_tracing_is_off_and_imports_none_of_it():
    # A fresh interpreter where `import opentelemetry` fails, as on an install
    # without the otel extra.
    code = """
import sys
sys.modules["opentelemetry"] = None
from relier_django.core.model import tracing
from relier_django.core.model.envelope import Envelope
from relier_django.core.push import producer
from relier_django.core.worker import runner
assert tracing.ENABLED is False
assert tracing.inject() == {}
with tracing.push_span("t"):
    tracing.annotate(Envelope(id="i", task="t"))
with tracing.run_span(Envelope(id="i", task="t", trace={"traceparent": "x"})):
    pass
assert not [m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]]
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
