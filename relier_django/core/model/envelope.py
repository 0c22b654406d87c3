"""The envelope: what is stored at push, sent through the broker, and replayed.

Canonical JSON (sorted keys, compact separators, no NaN) with a SHA-256 checksum
over the canonical bytes of every other field, and, when signing keys are
configured, an HMAC-SHA256 over the same bytes (``signing``). The worker verifies
both before anything runs; a message that fails becomes an ``EnvelopeError``
carrying its raw body for the DLQ.

Two versions, never to be confused:

- ``v`` is the envelope *format* (``FORMAT_VERSION``): how relier_django itself lays
  out a message. It changes only with relier_django, and only for a change an older
  reader could not safely ignore.
- ``schema_version`` is the *task's* argument schema (``@rl_task(version=N)``). The
  envelope only carries it; ``schema`` and the runner act on it.

How tolerant ``decode`` is, so that a rolling upgrade of relier_django itself can
mix releases:

- a field missing from the message takes its default (``schema_version`` → 1), so
  an envelope written before a field existed still reads;
- a field this release does not know is kept verbatim in ``Envelope.extra`` and
  written back by ``encode``, so a retry or resurrection on an older worker does not
  drop what a newer one wrote (the checksum and HMAC cover it);
- a format newer than ``FORMAT_VERSION`` is refused with reason ``schema_migration``
  (its raw body kept): its meaning cannot be guessed.

``trace`` (W3C trace context, see ``tracing``) is such an ignorable field, so it came
without a new format: an older reader keeps it in ``extra``. It is left out of the
body when empty, so an untraced envelope and its checksum are byte for byte what they
were before the field existed.

``push`` (a token minted once per push: with the id, the task's identity) is one too:
an older reader keeps it in ``extra``; absent, the id alone is the identity, as it was.
Workers are upgraded before producers (docs/rolling-deploys.md), so every worker that
runs an envelope carrying it reads it.

``chain`` (the steps of a workflow still to come after this one), ``chord`` (a chord
member's place in its header) and ``header`` (a chord callback's header) are not
ignorable: a reader that ignored them would commit the step and silently drop the rest
of the workflow, or run a callback without its header's results. An envelope that
carries one is written as format 2, which a release that does not
know workflows refuses (``schema_migration``, into the DLQ, from which it is released
once every worker is upgraded); every other envelope stays format 1, byte for byte.

``link`` and ``link_error`` (the callbacks a commit creates, the errbacks a filing in
the DLQ creates) are not ignorable either, for the same reason: an older reader would
run the task and drop its callbacks. An envelope that carries one is written as
format 3, which a release that predates them refuses the same way.

A nested workflow (a chain inside a chord's header, whose steps carry the chord's
place; a group inside a chain, whose members ride as a step's callbacks with their
place in a header; a chord's callback carrying the steps after it) is format 4: a
format-3 reader would read the steps and drop what they nest, so the chord's callback
would never be created, or a group's members never run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import EnvelopeError
from .signing import SignatureInvalid, Signer

FORMAT_VERSION = 4  # the newest format this release reads
_CHAIN_FORMAT = 2  # the format of an envelope that carries a chain
_LINK_FORMAT = 3  # the format of an envelope that carries a link or a link_error
_NESTED_FORMAT = 4  # one whose workflow nests (a chain in a chord, a group in a chain)
# Wire keys that are not fields: the checksum and the signature over the rest.
_CHECKSUM, _SIGNATURE = "sha256", "hmac"


def canonical(value: Any) -> str:
    """One byte sequence per value: the checksum, the idempotency key and the
    stored copy all depend on it."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@dataclass(frozen=True, slots=True)
class Envelope:
    """One incarnation of a task.

    ``fence`` grows with every incarnation (first dispatch, retry, resurrection,
    release); ``attempt`` counts executions caused by retries; ``resurrections``
    counts re-dispatches after a worker died. ``schema_version`` is the task's
    argument schema the producer pushed with; a worker migrates the arguments in
    memory and never rewrites it. ``extra`` holds fields written by a newer
    relier_django, passed through untouched. ``trace`` is the W3C trace context of the
    push (``traceparent``, ``tracestate``, as ``opentelemetry.propagate`` writes them),
    empty when the push was not traced; every later incarnation keeps it.
    """

    id: str
    task: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = ""
    idem_key: str | None = None
    fence: int = 1
    attempt: int = 1
    resurrections: int = 0
    created_ms: int = 0
    schema_version: int = 1
    v: int = 1
    trace: Mapping[str, str] = field(default_factory=dict)
    # A workflow step: the id of the workflow's first task (its identity in the DLQ and
    # the admin), and the steps that follow this one (workflow.Step.wire() each).
    workflow: str = ""
    chain: tuple[Mapping[str, Any], ...] = ()
    # A chord's header member: {"id": group id, "index": i, "callback": step}; and a
    # chord's callback: the group id whose header results it takes first.
    chord: Mapping[str, Any] = field(default_factory=dict)
    header: str = ""
    # Celery's link= and link_error=: the tasks this task's commit creates with its
    # result, and those its filing in the DLQ creates with its id (workflow.Step.wire()
    # each).
    link: tuple[Mapping[str, Any], ...] = ()
    link_error: tuple[Mapping[str, Any], ...] = ()
    # A token minted once per push (every incarnation keeps it): with the id, the
    # task's identity (:attr:`identity`). Absent from an envelope pushed before it
    # existed, which keeps the id alone as its identity.
    push: str = ""
    # The push's priority, 0..9 (9 runs first), kept by every incarnation; None: none
    # given (the broker's lowest). Ignorable, as trace: an older reader keeps it in extra.
    priority: int | None = None
    # The push's own flow control (``push_with(limit=, concurrency_key=)``): a named
    # limit in place of its task's, and its key; kept by every incarnation and by the
    # DLQ, so a relay, a release or a successor goes through the same gate. None: the
    # task's own. Ignorable, as priority.
    limit: str | None = None
    limit_key: str | None = None
    # Celery's parent_id: the task whose commit created this one (a chain's step before,
    # the task a callback or errback is linked to, the member completing a chord's
    # header), or the task that pushed it from its body; "" for neither. Ignorable, as
    # priority: an older reader keeps it in extra.
    parent: str = ""
    # Celery's expires: the epoch ms after which a start is refused (expires=), as the
    # producer's clock put it (the store enforces it on its own clock); None: none.
    # Ignorable too.
    expires_ms: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        """This task's identity: its id and the token of the push that created it. A
        caller-chosen id can be pushed again once its outcome has expired
        (``RESULT_TTL_S``); anything keyed by the task and kept longer (the inbox's
        rows, an external API's idempotency keys) is keyed by this, which the later
        task does not share."""
        return f"{self.id}~{self.push}" if self.push else self.id

    def next_incarnation(self, **changes: Any) -> Envelope:
        """The envelope of the next incarnation: fence + 1, other changes applied."""
        return dataclasses.replace(self, fence=self.fence + 1, **changes)

    def _body(self) -> dict[str, Any]:
        body = {name: getattr(self, name) for name in _WIRE_FIELDS}
        body["args"] = list(self.args)
        if self.trace:
            body["trace"] = dict(self.trace)
        else:  # absent, not {}: untraced envelopes stay as they were (module docstring)
            del body["trace"]
        # Absent when empty, as trace: an envelope outside a workflow is unchanged.
        for name in ("priority", "limit", "limit_key", "expires_ms"):
            if body[name] is None:
                del body[name]
        for name in ("workflow", "chain", "chord", "header", "push", "link", "link_error",
                     "parent"):  # fmt: skip
            if not body[name]:
                del body[name]
        for name in ("chain", "link", "link_error"):
            if body.get(name):
                body[name] = [dict(step) for step in getattr(self, name)]
        if self.chord:
            body["chord"] = dict(self.chord)
        if self.chain or self.chord or self.header:
            body["v"] = max(self.v, _CHAIN_FORMAT)
        if self.link or self.link_error:
            body["v"] = max(self.v, _LINK_FORMAT)
        if _nests(self):
            body["v"] = max(self.v, _NESTED_FORMAT)
        body.update(self.extra)
        return body

    def encode(self, signer: Signer | None = None) -> str:
        """The canonical JSON of this envelope with its checksum, and with an HMAC
        by the newest key when ``signer`` is given (pass ``Config.signer`` wherever
        an envelope is stored or published: push, retry, resurrection, release, DLQ)."""
        body = self._body()
        data = canonical(body).encode()
        body[_CHECKSUM] = hashlib.sha256(data).hexdigest()
        if signer is not None:
            body[_SIGNATURE] = signer.sign(data)
        return canonical(body)


_NESTING = ("link", "chord", "chain")  # a step's fields that nest a workflow in it


def _nests(env: Envelope) -> bool:
    """Whether ``env``'s workflow nests: a chain inside a chord's header (its steps
    carry the chord's place), a group inside a chain (a step's callbacks, or header
    members with their place), or a chord's callback carrying the steps after it."""
    if env.chain and env.chord:
        return True
    steps = (*env.chain, *env.link, *([env.chord["callback"]] if "callback" in env.chord else []))
    return any(isinstance(s, Mapping) and any(k in s for k in _NESTING) for s in steps)


_WIRE_FIELDS = tuple(f.name for f in dataclasses.fields(Envelope) if f.name != "extra")
_REQUIRED = {"id", "task", "fence", "v", _CHECKSUM}
# What the runner relies on: a message whose checksum matches but whose fields have
# the wrong types is refused here rather than failing inside user code.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "id": str, "task": str, "args": list, "kwargs": dict, "queue": str,
    "idem_key": (str, type(None)), "fence": int, "attempt": int, "resurrections": int,
    "created_ms": int, "schema_version": int, "trace": dict, "workflow": str, "chain": list,
    "chord": dict, "header": str, "push": str, "link": list, "link_error": list,
    "priority": (int, type(None)), "limit": (str, type(None)), "limit_key": (str, type(None)),
    "parent": str, "expires_ms": (int, type(None)),
}  # fmt: skip


def _as_sent(raw: object, claimed: object, signature: object) -> bytes | None:
    """What ``encode`` hashed, cut back out of the message it wrote: the message
    without its checksum (and signature) member. Saves re-encoding the body on every
    delivery. Trusted only when it hashes to the claimed checksum, so a message
    altered after its checksum was computed fails it and is checked the slow way
    (re-encoded). The one difference from the slow way: a producer that hashed its own
    non-canonical text (unsorted or duplicate keys) passes here; an unsigned checksum
    never proved who wrote a message, and a signed one covers exactly these bytes."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes | bytearray) else raw
    if not isinstance(text, str) or not isinstance(claimed, str):
        return None
    out = text.replace(f',"{_CHECKSUM}":"{claimed}"', "", 1)
    if signature is not None:
        if not isinstance(signature, str) or '"' in signature or "\\" in signature:
            return None
        out = out.replace(f',"{_SIGNATURE}":"{signature}"', "", 1)
    return out.encode()


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: an envelope holding one could never be re-encoded
    # (retry, resurrection, DLQ), so it is refused on arrival.
    raise ValueError(f"{name} is not valid JSON")


def _parse(raw: object) -> dict[str, Any]:
    if isinstance(raw, bytes | bytearray):
        try:
            raw = raw.decode()
        except UnicodeDecodeError as exc:
            raise EnvelopeError(
                "message is not UTF-8", raw=raw, reason="malformed_message"
            ) from exc
    if isinstance(raw, str):
        try:
            body = json.loads(raw, parse_constant=_no_constant)
        except ValueError as exc:
            raise EnvelopeError(
                f"message is not JSON: {exc}", raw=raw, reason="malformed_message"
            ) from exc
    elif isinstance(raw, dict):
        body = dict(raw)
    else:
        raise EnvelopeError(
            f"message is a {type(raw).__name__}, not an envelope",
            raw=raw,
            reason="malformed_message",
        )
    if not isinstance(body, dict) or not body.keys() >= _REQUIRED:
        missing = sorted(_REQUIRED - body.keys()) if isinstance(body, dict) else sorted(_REQUIRED)
        raise EnvelopeError(
            f"not an envelope: missing {', '.join(missing)}", raw=raw, reason="malformed_message"
        )
    return body


def _check_format(body: dict[str, Any], raw: object) -> None:
    v = body["v"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise EnvelopeError(f"bad envelope format {v!r}", raw=raw, reason="malformed_message")
    if v > FORMAT_VERSION:
        raise EnvelopeError(
            f"envelope format v{v} > v{FORMAT_VERSION}, the newest this relier_django "
            "reads: it was written by a newer relier_django. Upgrade relier_django on "
            "every worker before any producer",
            raw=raw,
            reason="schema_migration",
        )


def _check_types(body: dict[str, Any], raw: object) -> None:
    for name, expected in _TYPES.items():
        if name not in body:
            continue
        value = body[name]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise EnvelopeError(
                f"bad envelope: field {name!r} is a {type(value).__name__}",
                raw=raw,
                reason="malformed_message",
            )
    if body["fence"] < 1 or body.get("schema_version", 1) < 1:
        raise EnvelopeError(
            "bad envelope: fence and schema_version must be >= 1",
            raw=raw,
            reason="malformed_message",
        )


def decode(raw: object, signer: Signer | None = None) -> Envelope:
    """Parse and verify a message.

    The checksum is always verified. With ``signer`` (signing keys configured), the
    HMAC must also verify with one of its keys, and an unsigned envelope is refused
    (unless the signer accepts unsigned ones during a rollout). Without a signer, a
    signed envelope is accepted on its checksum alone: its HMAC cannot be checked.

    Raises:
        EnvelopeError: with the raw message and a DLQ reason code:
            ``malformed_message`` (not an envelope), ``payload_integrity`` (checksum
            or signature), ``schema_migration`` (a newer envelope format).
    """
    body = _parse(raw)
    _check_format(body, raw)
    claimed = body.pop(_CHECKSUM)
    signature = body.pop(_SIGNATURE, None)
    data = _as_sent(raw, claimed, signature)
    actual = hashlib.sha256(data).hexdigest() if data is not None else ""
    if data is None or actual != claimed:  # not as encode() wrote it: re-encode the body
        data = canonical(body).encode()
        actual = hashlib.sha256(data).hexdigest()
    if claimed != actual:
        raise EnvelopeError(
            f"checksum mismatch (claimed {str(claimed)[:12]}…, computed {actual[:12]}…)",
            raw=raw,
            reason="payload_integrity",
        )
    if signer is not None:
        try:
            signer.verify(data, signature)
        except SignatureInvalid as exc:
            raise EnvelopeError(str(exc), raw=raw, reason="payload_integrity") from None
    _check_types(body, raw)
    known = {name: body.pop(name) for name in _WIRE_FIELDS if name in body}
    try:
        steps: dict[str, Any] = {
            name: tuple(known.pop(name, ())) for name in ("chain", "link", "link_error")
        }
        for name, found in steps.items():
            if not all(isinstance(step, dict) for step in found):
                raise EnvelopeError(f"bad envelope: a {name} step is not an object", raw=raw,
                                    reason="malformed_message")  # fmt: skip
        return Envelope(**{**known, "args": tuple(known.get("args", ())), **steps}, extra=body)
    except TypeError as exc:
        raise EnvelopeError(f"bad envelope: {exc}", raw=raw, reason="malformed_message") from exc
