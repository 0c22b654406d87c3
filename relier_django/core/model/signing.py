"""HMAC-SHA256 signatures for envelopes, with key rotation.

The first configured key signs; every configured key verifies. A signature names
the key that made it by a *key id*: the first 16 hex digits of
``HMAC-SHA256(key, "relier_django signing key id")``. HMAC is a pseudo-random
function, so the id reveals nothing about the key, yet it lets a verifier pick the
one key to check (no trial of every key) and lets an error say *which* key signed a
message it cannot verify, which is what an operator needs in the middle of a
rotation.

Keys never appear in a ``repr``, a log line or an error message: only their ids do.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError, RelierError

# RFC 2104 advises keys no shorter than the hash's output (32 bytes for SHA-256).
MIN_KEY_BYTES = 32
_KID_LABEL = b"relier_django signing key id"
_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(48))'"


class SignatureInvalid(RelierError):
    """A signature is missing, malformed, made with an unknown key, or wrong.

    Internal: ``envelope.decode`` turns it into an ``EnvelopeError`` with reason
    ``payload_integrity`` that keeps the raw message.
    """


def key_id(key: str | bytes) -> str:
    """The public id of a key (16 hex digits), safe to log and to store."""
    secret = key.encode() if isinstance(key, str) else key
    return hmac.new(secret, _KID_LABEL, hashlib.sha256).hexdigest()[:16]


def check_keys(keys: object, name: str = "signing_keys") -> None:
    """Refuse key lists that cannot be safe.

    Raises:
        ConfigError: not a tuple/list of strings, or a key shorter than
            ``MIN_KEY_BYTES`` bytes (UTF-8). The message names the key's position,
            never its value.
    """
    if not isinstance(keys, tuple | list):  # a bare string would be read as its characters
        raise ConfigError(
            f"{name} must be a list of keys (newest first), got a {type(keys).__name__}"
        )
    for i, key in enumerate(keys):
        if not isinstance(key, str):
            raise ConfigError(f"{name}[{i}] must be a string, got a {type(key).__name__}")
        size = len(key.encode())
        if size < MIN_KEY_BYTES:
            raise ConfigError(
                f"{name}[{i}] is {size} bytes; HMAC-SHA256 keys must be at least "
                f"{MIN_KEY_BYTES} random bytes. Generate one with: {_GENERATE}"
            )


class Signer:
    """Signs with the newest key, verifies with any listed key.

    Args:
        keys: newest first. Non-empty; each at least ``MIN_KEY_BYTES`` bytes.
        accept_unsigned: accept a message that carries no signature at all (a bad
            signature is refused all the same). Only for the window while signing is
            being rolled out; see docs/rolling-deploys.md.

    Raises:
        ConfigError: no keys, or a key that ``check_keys`` refuses.
    """

    __slots__ = ("_by_id", "_signing", "accept_unsigned", "key_ids")

    def __init__(self, keys: Sequence[str], *, accept_unsigned: bool = False) -> None:
        check_keys(list(keys))
        if not keys:
            raise ConfigError("a Signer needs at least one key")
        secrets = [k.encode() for k in keys]
        self.key_ids: tuple[str, ...] = tuple(key_id(s) for s in secrets)
        self._by_id = dict(zip(self.key_ids, secrets, strict=True))
        self._signing = (self.key_ids[0], secrets[0])
        self.accept_unsigned = accept_unsigned

    def __repr__(self) -> str:
        return f"Signer(key_ids={self.key_ids!r}, accept_unsigned={self.accept_unsigned})"

    def sign(self, data: bytes) -> dict[str, str]:
        """The signature of ``data`` with the newest key: ``{"kid": ..., "sha256": ...}``."""
        kid, secret = self._signing
        return {"kid": kid, "sha256": hmac.new(secret, data, hashlib.sha256).hexdigest()}

    def verify(self, data: bytes, signature: Any) -> None:
        """Check a signature made by :meth:`sign` with any of the keys.

        Raises:
            SignatureInvalid: with a message that says what to do about it.
        """
        if signature is None:
            if self.accept_unsigned:
                return
            raise SignatureInvalid(
                "the envelope is not signed, and SIGNING_KEYS is set here: it was pushed "
                "by a process without SIGNING_KEYS, or its signature was stripped. Set "
                "the same SIGNING_KEYS on every producer and worker (while rolling "
                "signing out, SIGNING_ACCEPT_UNSIGNED=True accepts unsigned envelopes)"
            )
        if not (
            isinstance(signature, dict)
            and isinstance(signature.get("kid"), str)
            and isinstance(signature.get("sha256"), str)
        ):
            raise SignatureInvalid("the envelope's signature is malformed")
        secret = self._by_id.get(signature["kid"])
        if secret is None:
            raise SignatureInvalid(
                f"the envelope is signed with key id {signature['kid'][:16]}, which is not "
                f"among this process's SIGNING_KEYS (ids {', '.join(self.key_ids)}): keep "
                "an old key listed (after the new one) until every envelope it signed "
                "has run or been released"
            )
        expected = hmac.new(secret, data, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature["sha256"]):
            raise SignatureInvalid(
                f"the envelope's HMAC does not match (key id {signature['kid']}): it was "
                "changed after it was signed"
            )


@functools.lru_cache(maxsize=8)
def signer(keys: tuple[str, ...], accept_unsigned: bool = False) -> Signer | None:
    """The signer for a configuration's keys, or None when signing is off (no keys).

    Cached: key ids are computed once per key list, not once per message.
    """
    return Signer(keys, accept_unsigned=accept_unsigned) if keys else None
