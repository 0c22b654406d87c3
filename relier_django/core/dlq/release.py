"""Releasing a DLQ entry: its task runs again as a fresh incarnation, exactly once.

``release.lua`` takes the entry out of the DLQ index and re-creates the task (next
fence, attempt and resurrection counters reset, history kept) in one step, so of two
concurrent releases only one proceeds. The envelope is then published; if the broker
refuses it, ``release_abort.lua`` puts the entry back and removes the task.

A task with flow control (its own limits, or its push's ``limit=``, which its envelope
keeps) is released through its gate, as a push is (G14): ``release.lua`` stores it due
now in the schedule index with its gate, nothing is published here, and the scanner
leader dispatches it once its rate and a slot allow, parking it in its key's line
while none is free. A partitioned store has no flow control: it is published at once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..broker import publish
from ..model import events, limits, resurrections
from ..model.config import Config
from ..model.envelope import Envelope, decode
from ..model.errors import ConfigError, EntryNotReleasable, EnvelopeError
from ..model.transition import history_tail
from ..store import scripts
from ..store.connection import sync_client
from ..store.keys import KeySpace
from ..store.receipt import Receipt
from .entries import Entry
from .store import Cursor, DeadLetterStore, Query

logger = logging.getLogger("relier_django.release")


def _max_resurrections(app: Any, task_name: str, config: Config) -> int | str:
    task = getattr(app, "tasks", {}).get(task_name)
    spec = getattr(task, "relier_spec", None)
    return resurrections.stored(
        getattr(spec, "max_resurrections", None), config.resurrection_policy()
    )


def _gate(app: Any, config: Config, keys: KeySpace, entry_id: str, env: Envelope) -> str:
    """The released task's gate as release.lua takes it ('' for none): its task's flow
    control, or its push's own (``Envelope.limit``), as at push.

    Raises:
        EntryNotReleasable: its limit cannot be read now (a ``limit=`` the settings no
            longer define, a key that is not one): releasing it ungated would break
            the limit, so it stays in the DLQ, saying why.
    """
    spec = getattr(getattr(app, "tasks", {}).get(env.task), "relier_spec", None)
    if spec is None or keys.tagged or not (spec.limits or env.limit):
        return ""
    try:
        found = limits.gate_of(spec.name, spec.limits, config.named_limits(),
                               spec.user_signature(), env.args, env.kwargs, env.limit,
                               env.limit_key)  # fmt: skip
    except (ConfigError, ValueError) as exc:
        raise EntryNotReleasable(entry_id, f"its flow control cannot be read: {exc}") from exc
    return "" if found is None else found.script_arg()


def _envelope(entry_id: str, entry: Entry, config: Config) -> Envelope:
    stored = entry.data.get("envelope")
    if stored is None:
        raise EntryNotReleasable(entry_id, "it holds no envelope (a malformed message); inspect it")
    try:
        # Verified before it is re-signed: an entry edited in Redis stays refused.
        return decode(json.dumps(stored), config.signer)
    except EnvelopeError as exc:
        raise EntryNotReleasable(entry_id, f"its envelope does not verify: {exc}") from exc


def release(app: Any, config: Config, entry_id: str, expected_fence: int | None = None) -> Receipt:
    """Dispatch a DLQ entry's task again; returns the receipt of the new incarnation.

    ``expected_fence`` (an entry's ``fence``, as the operator saw it) pins the release
    to that failure: if the task was released meanwhile and failed again, the entry
    now holds a later failure and is left alone. Without it, whatever failure the
    entry holds now is released.

    A task with flow control goes through its gate (module docstring): it is
    stored due now and dispatched by the scanner leader when its rate and a slot allow,
    never past its limit; its entry is dropped at once.

    Raises:
        EntryNotReleasable: unknown or already released entry, a later failure than
            ``expected_fence``, no envelope, the task id is live again, or its flow
            control cannot be read (a ``limit=`` the settings no longer define).
        Any broker error: the entry is back in the DLQ, unchanged.
    """
    keys = KeySpace.of(config)
    client = sync_client(config)
    entry = DeadLetterStore(client, keys).get(entry_id)
    if entry is None:
        raise EntryNotReleasable(entry_id, "no such entry in the dead-letter queue")
    if expected_fence is not None and entry.fence != expected_fence:
        raise EntryNotReleasable(
            entry_id,
            f"no such entry in the dead-letter queue holding the failure at fence "
            f"{expected_fence} (it holds fence {entry.fence})",
        )
    env = _envelope(entry_id, entry, config)
    fresh = dataclasses.replace(env, fence=env.fence + 1, attempt=1, resurrections=0)
    encoded = fresh.encode(config.signer)
    idem = keys.idempotency(env.task, env.idem_key) if env.idem_key else None
    grace_ms = int(config.queued_grace_s * 1000)
    tail = history_tail("released", fence=fresh.fence, entry=entry_id, reason=entry.reason)
    gate = _gate(app, config, keys, entry_id, env)
    code = scripts.ScriptCall(
        scripts.RELEASE,
        keys.for_release(entry_id, env.id, idem),
        [entry_id, env.id, encoded, fresh.fence, env.task, env.queue,
         _max_resurrections(app, env.task, config), grace_ms, tail,
         # Always the failure just read: the new fence is derived from its envelope,
         # so a newer failure landing before the script runs must refuse this release.
         env.fence, uuid.uuid4().hex, gate],
        int,
    ).run(client)  # fmt: skip
    if code == 0:
        raise EntryNotReleasable(
            entry_id,
            f"no such entry in the dead-letter queue holding the failure at fence {env.fence}",
        )
    if code == -1:
        raise EntryNotReleasable(entry_id, f"task {env.id} is live again; it was not re-created")
    if code != 2:  # 2: gated, the scanner leader dispatches it through its gate
        _publish(app, client, keys, entry_id, env, fresh, encoded, idem)
    scripts.ScriptCall(
        scripts.RELEASE_DONE, keys.for_release_done(entry_id), [fresh.fence], int
    ).run(client)
    logger.warning(
        "released DLQ entry %s task_id=%s fence=%s gated=%s", entry_id, env.id, fresh.fence,
        code == 2,
    )  # fmt: skip
    events.emit(
        events.TaskReleased(env.id, env.task, fresh.fence, entry_id, entry.reason, env.queue)
    )
    return Receipt(env.id, deduplicated=False, config=config)


def _publish(
    app: Any,
    client: Any,
    keys: KeySpace,
    entry_id: str,
    env: Envelope,
    fresh: Envelope,
    encoded: str,
    idem: str | None,
) -> None:
    """Send the re-created task; if the broker refuses it, put the entry back."""
    try:
        publish.send(app, fresh, encoded)
    except BaseException:
        scripts.ScriptCall(
            scripts.RELEASE_ABORT,
            keys.for_release_abort(entry_id, env.id, idem),
            [entry_id, env.id, fresh.fence],
            int,
        ).run(client)
        raise


@dataclass(frozen=True, slots=True)
class BulkRelease:
    """What ``release_matching`` did (or, dry, would do)."""

    released: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()  # (entry id, why)
    dry_run: bool = False


@dataclass
class _Tally:
    released: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


def release_matching(
    app: Any,
    config: Config,
    query: Query,
    *,
    dry_run: bool = False,
    on_release: Callable[[str], None] | None = None,
) -> BulkRelease:
    """Release every entry matching ``query``, each pinned to the failure listed.

    One entry's refusal (no envelope, live again) does not stop the rest; it is
    reported in ``refused``. A broker error stops the run and propagates: the entry
    it hit is back in the DLQ, and the ones before it are released.
    With ``dry_run`` nothing changes; ``released`` lists what would be released.
    """
    store = DeadLetterStore(sync_client(config), KeySpace.of(config))
    tally = _Tally()
    cursor: Cursor | None = None
    while True:
        page = store.page(query, cursor, limit=200)
        for summary in page.entries:
            if summary.fence is None:
                tally.refused.append((summary.id, "it holds no envelope (a malformed message)"))
            elif dry_run:
                tally.released.append(summary.id)
            else:
                try:
                    release(app, config, summary.id, expected_fence=summary.fence)
                except EntryNotReleasable as exc:
                    tally.refused.append((summary.id, exc.reason))
                    continue
                tally.released.append(summary.id)
                if on_release is not None:
                    on_release(summary.id)
        if page.next_cursor is None:
            return BulkRelease(tuple(tally.released), tuple(tally.refused), dry_run)
        cursor = page.next_cursor
