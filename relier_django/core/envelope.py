"""The envelope: what is stored at push, sent through the broker, and replayed.

Canonical JSON (sorted keys, compact separators, no NaN), versioned, with a SHA-256
checksum over the canonical bytes of every other field. The worker verifies the
checksum before anything runs; a message that fails becomes an ``EnvelopeError``
carrying its raw body for the DLQ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import EnvelopeError

FORMAT_VERSION = 1


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
    counts re-dispatches after a worker died.
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
    v: int = FORMAT_VERSION

    def next_incarnation(self, **changes: Any) -> Envelope:
        """The envelope of the next incarnation: fence + 1, other changes applied."""
        return dataclasses.replace(self, fence=self.fence + 1, **changes)

    def _body(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        body["args"] = list(self.args)
        return body

    def encode(self) -> str:
        body = self._body()
        text = canonical(body)
        body["sha256"] = hashlib.sha256(text.encode()).hexdigest()
        return canonical(body)


_FIELDS = {f.name for f in dataclasses.fields(Envelope)}
_REQUIRED = {"id", "task", "fence", "v", "sha256"}


def decode(raw: object) -> Envelope:
    """Parse and verify a message. Raises ``EnvelopeError`` with a DLQ reason code."""
    if isinstance(raw, bytes | bytearray):
        try:
            raw = raw.decode()
        except UnicodeDecodeError as exc:
            raise EnvelopeError(
                "message is not UTF-8", raw=raw, reason="malformed_message"
            ) from exc
    if isinstance(raw, str):
        try:
            body = json.loads(raw)
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
    if body["v"] != FORMAT_VERSION:
        raise EnvelopeError(
            f"envelope format v{body['v']} is not understood (this worker reads v{FORMAT_VERSION})",
            raw=raw,
            reason="schema_migration",
        )
    claimed = body.pop("sha256")
    actual = hashlib.sha256(canonical(body).encode()).hexdigest()
    if claimed != actual:
        raise EnvelopeError(
            f"checksum mismatch (claimed {str(claimed)[:12]}…, computed {actual[:12]}…)",
            raw=raw,
            reason="payload_integrity",
        )
    unknown = body.keys() - _FIELDS
    if unknown:
        raise EnvelopeError(
            f"unknown envelope fields {sorted(unknown)}", raw=raw, reason="malformed_message"
        )
    try:
        return Envelope(**{**body, "args": tuple(body.get("args", ()))})
    except TypeError as exc:
        raise EnvelopeError(f"bad envelope: {exc}", raw=raw, reason="malformed_message") from exc
