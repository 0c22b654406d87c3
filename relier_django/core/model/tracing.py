"""OpenTelemetry across a task's hops, when ``opentelemetry`` is installed (the ``otel``
extra); without it every function here is a no-op and nothing is imported.

At push, ``push_span`` opens a PRODUCER span ``relier.push <task>`` and ``inject`` writes
its W3C trace context into the envelope (``Envelope.trace``). On the worker,
``run_span`` extracts it and runs the task inside a CONSUMER span ``relier.run <task>``,
a child of the push's. The context lives in the envelope, not in Celery's headers,
because the envelope is what every later incarnation is built from: a retry, a
resurrection and a release keep it, so they all land in the push's trace.

Two decisions:

- A push opens a span (and writes a context) only inside a span already in progress:
  an application that does not trace pays nothing, and its envelopes stay byte for
  byte as they were.
- A run always opens its span (a no-op with OpenTelemetry's default provider): under
  the push's context when the envelope carries one, else under whatever is current
  (Celery's own instrumentation, or none: a new trace).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from .envelope import Envelope

try:
    from opentelemetry import propagate, trace
except ImportError:  # the otel extra is not installed: tracing is off
    ENABLED = False
else:
    ENABLED = True

_TRACER = "relier_django"


def _no_tracer_configured() -> bool:
    # OpenTelemetry's default provider until an SDK sets one: its spans record nothing.
    # Asked at every run, so a provider set after the worker started is used at once.
    provider = trace.get_tracer_provider()
    return isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _tracing_now() -> bool:
    return ENABLED and trace.get_current_span().get_span_context().is_valid


def inject() -> dict[str, str]:
    """The current trace context as W3C headers, for ``Envelope.trace``; ``{}`` when
    OpenTelemetry is absent or no span is in progress."""
    if not _tracing_now():
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def push_span(task: str) -> Iterator[None]:
    """A PRODUCER span ``relier.push <task>`` around a push, current while it lasts (so
    ``inject`` writes its context); nothing when no span is in progress."""
    if not _tracing_now():
        yield
        return
    tracer = trace.get_tracer(_TRACER)
    kind = trace.SpanKind.PRODUCER
    with tracer.start_as_current_span(
        f"relier.push {task}", kind=kind, attributes={"relier.task": task}
    ):
        yield


def annotate(env: Envelope) -> None:
    """Name the task on the span in progress (the push's, once its id is known)."""
    if ENABLED:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("relier.task_id", env.id)


def _carrier(headers: Mapping[str, object]) -> dict[str, str]:
    # Only text survives: a context is advisory, never a reason to refuse a task.
    return {k: v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}


@contextlib.contextmanager
def run_span(env: Envelope) -> Iterator[None]:
    """A CONSUMER span ``relier.run <task>`` around one incarnation's call, a child of
    the push's context when the envelope carries one. The task's exception is recorded
    on it and propagates."""
    if not ENABLED or (not env.trace and _no_tracer_configured()):
        # Every span would be a no-op with nothing to carry: skip building one (a few
        # percent of a no-op task's worker CPU, bench/throughput.py).
        yield
        return
    parent = propagate.extract(_carrier(env.trace)) if env.trace else None
    tracer = trace.get_tracer(_TRACER)
    attributes: dict[str, str | int] = {
        "relier.task": env.task,
        "relier.task_id": env.id,
        "relier.fence": env.fence,
        "relier.attempt": env.attempt,
        "relier.resurrections": env.resurrections,
    }
    with tracer.start_as_current_span(
        f"relier.run {env.task}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
    ):
        yield
