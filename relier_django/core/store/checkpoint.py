"""Checkpoints: the JSON state a task saves with ``ctx.set_partial`` to resume from.

A checkpoint lives with its task (the task hash's ``partial`` field), written only by
the current incarnation (``checkpoint.lua`` checks the fence). It survives retries and
resurrections, moves into the DLQ entry on a failure and back on release, and goes
when the task commits. Up to ``checkpoint_max_bytes`` it is stored inline; a larger
one is written to a file under ``checkpoint_dir`` and Redis keeps its path and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..model.config import Config
from ..model.envelope import canonical
from ..model.errors import CheckpointTooLarge, RelierError
from ..model.transition import Transition, parse_transition
from . import scripts
from .keys import KeySpace


def _task_dir(directory: str, task_id: str) -> Path:
    # Hashed: a caller-chosen task id may hold '/' or '..'.
    return Path(directory) / hashlib.sha256(task_id.encode()).hexdigest()[:32]


def record(config: Config, task_id: str, fence: int, state: Any) -> str:
    """The record to store for ``state``: inline JSON, or a file reference.

    Raises:
        TypeError: ``state`` is not JSON-serialisable.
        CheckpointTooLarge: too large and no ``checkpoint_dir`` is configured.
    """
    try:
        body = canonical(state)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a checkpoint must be JSON-serialisable: {exc}") from exc
    size = len(body.encode())
    if size <= config.checkpoint_max_bytes:
        return canonical({"inline": state})
    if config.checkpoint_dir is None:
        raise CheckpointTooLarge(size, config.checkpoint_max_bytes)
    digest = hashlib.sha256(body.encode()).hexdigest()
    folder = _task_dir(config.checkpoint_dir, task_id)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{fence}-{digest[:16]}.json"
    # Written whole, then renamed: a reader never sees half a checkpoint.
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        out.write(body)
    os.replace(tmp, path)
    return canonical({"file": str(path), "sha256": digest, "bytes": size})


def load(stored: str) -> Any:
    """The state a record holds (None for no record).

    Raises:
        RelierError: a file checkpoint is missing or does not match its SHA-256.
    """
    if not stored:
        return None
    rec = json.loads(stored)
    if "inline" in rec:
        return rec["inline"]
    try:
        body = Path(rec["file"]).read_text()
    except OSError as exc:
        raise RelierError(f"checkpoint file {rec['file']} cannot be read: {exc}") from exc
    if hashlib.sha256(body.encode()).hexdigest() != rec["sha256"]:
        raise RelierError(f"checkpoint file {rec['file']} does not match its SHA-256")
    return json.loads(body)


def save(keys: KeySpace, task_id: str, fence: int, stored: str) -> scripts.ScriptCall[Transition]:
    """checkpoint.lua: store the record if ``fence`` is still the task's."""
    return scripts.ScriptCall(
        scripts.CHECKPOINT, keys.for_checkpoint(task_id), [fence, stored], parse_transition
    )


def remove_superseded_files(directory: str, task_id: str, current: str) -> None:
    """After ``current`` was accepted as the task's checkpoint: delete its other files.

    Only the record Redis holds can ever be loaded again (a new incarnation starts from
    it, a release restores it), so every earlier file of the task is garbage; without
    this a long task that checkpoints often would fill ``checkpoint_dir``.
    """
    keep = json.loads(current).get("file")
    folder = _task_dir(directory, task_id)
    for path in folder.glob("*.json"):
        if str(path) != keep:
            path.unlink(missing_ok=True)


def remove_files(directory: str | None, task_id: str) -> None:
    """Delete a task's checkpoint files (after its commit, or its DLQ entry's delete);
    ``directory`` is the ``checkpoint_dir`` in force (None: there are no files)."""
    if directory is not None:
        shutil.rmtree(_task_dir(directory, task_id), ignore_errors=True)
