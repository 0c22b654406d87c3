"""OpenTelemetry: a push made inside a span carries its context in the envelope, and
the run (the real runner, in this process, against the private Redis) joins that
trace as a child of the push; a resurrected incarnation stays in the same trace."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.spec import TaskSpec
from relier_django.core.push import producer
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker.runner import Runner
from testproject.celery import app

KEYS = KeySpace("rl")
_EXPORTER = InMemorySpanExporter()


def _install_provider() -> None:
    # The global provider can be set once per process: the first test sets it, with
    # an exporter this module reads; untraced code elsewhere is unaffected by it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    assert isinstance(trace.get_tracer_provider(), TracerProvider), "another provider is set"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _install_provider()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


seen: list[trace.SpanContext] = []


def traced_def(label: str) -> str:
    seen.append(trace.get_current_span().get_span_context())
    return label


async def traced_async(label: str) -> str:
    seen.append(trace.get_current_span().get_span_context())
    return label


DEF = TaskSpec(name="t.traced_def", fn=traced_def)
ASYNC = TaskSpec(name="t.traced_async", fn=traced_async)


def _queued(queue: str) -> list[Envelope]:
    """The envelopes in a broker queue, as a worker would receive them."""
    messages = sync_client(config.current()).lrange(queue, 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in messages]
    return [decode(b) for b in bodies]


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _push_traced(spec: TaskSpec, label: str) -> tuple[trace.SpanContext, Envelope]:
    with trace.get_tracer("test").start_as_current_span("request") as request:
        receipt = producer.push(spec, app, (label,), {}, on_commit=False)
    (env,) = [e for e in _queued("celery") if e.id == receipt.task_id]
    return request.get_span_context(), env


@pytest.mark.parametrize("spec", [DEF, ASYNC], ids=["def", "async_def"])
def test_a_run_is_a_consumer_span_in_the_trace_of_the_push_that_made_it(redis_client, spans, spec):
    seen.clear()
    request, env = _push_traced(spec, "t1")
    assert set(env.trace) >= {"traceparent"}

    runner = Runner(spec, app, config.current(), "test:1")
    if spec.is_async:
        asyncio.run(runner.run(env.encode()))
    else:
        runner.run_blocking(env.encode())

    (pushed,) = _named(spans, f"relier.push {spec.name}")
    (ran,) = _named(spans, f"relier.run {spec.name}")
    assert pushed.kind is trace.SpanKind.PRODUCER
    assert pushed.parent is not None and pushed.parent.span_id == request.span_id
    assert pushed.attributes is not None and pushed.attributes["relier.task_id"] == env.id
    assert ran.kind is trace.SpanKind.CONSUMER
    assert ran.context.trace_id == pushed.context.trace_id == request.trace_id
    assert ran.parent is not None and ran.parent.span_id == pushed.context.span_id
    assert ran.attributes == {
        "relier.task": spec.name, "relier.task_id": env.id, "relier.fence": 1,
        "relier.attempt": 1, "relier.resurrections": 0,
    }  # fmt: skip
    # The task ran inside the run span: what it sees as current is that span.
    assert [(c.trace_id, c.span_id) for c in seen] == [(ran.context.trace_id, ran.context.span_id)]
    assert sync_client(config.current()).get(KEYS.result(env.id)) is not None  # committed


def test_a_push_outside_any_span_makes_no_span_and_an_envelope_without_context(redis_client, spans):
    receipt = producer.push(DEF, app, ("bare",), {}, on_commit=False)
    (env,) = [e for e in _queued("celery") if e.id == receipt.task_id]
    assert env.trace == {}
    assert '"trace"' not in sync_client(config.current()).hget(KEYS.task(env.id), "env")
    assert _named(spans, f"relier.push {DEF.name}") == []


def test_a_resurrected_incarnation_stays_in_the_trace_of_its_push(redis_client, spans):
    request, env = _push_traced(DEF, "r1")
    client = sync_client(config.current())
    client.delete("celery")  # the first message is lost with its worker
    seconds, _ = client.time()
    client.zadd(KEYS.expiry, {env.id: (int(seconds) - 60) * 1000})

    cfg = config.current()
    assert Resurrector(app, cfg, "tracing").run_pass().resurrected == 1

    (again,) = _queued(cfg.recovery_queue)
    assert (again.id, again.fence, again.resurrections) == (env.id, 2, 1)
    assert again.trace == env.trace
    Runner(DEF, app, cfg, "test:1").run_blocking(again.encode())
    (ran,) = _named(spans, f"relier.run {DEF.name}")
    assert ran.context.trace_id == request.trace_id
    assert ran.attributes is not None and ran.attributes["relier.resurrections"] == 1
    assert client.get(KEYS.result(env.id)) is not None  # the resurrected run committed
