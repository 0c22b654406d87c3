"""How a running incarnation stores its progress (``ctx.set_progress``): progress.lua,
fenced by the incarnation's own fence, on the worker's client."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import redis.asyncio

from ..model.envelope import Envelope
from ..model.errors import TaskLost
from ..store import progress
from ..store.keys import KeySpace


def reporter(
    client: Callable[[], redis.asyncio.Redis],
    keys: KeySpace,
    env: Envelope,
    lost: Callable[[], None],
) -> Callable[[str], Coroutine[Any, Any, None]]:
    """The ``ctx._report`` of the incarnation ``env``: stores a progress record, or
    calls ``lost`` and raises ``TaskLost`` when the fence moved (G2: a zombie learns it
    at once, as from a refused checkpoint). ``client()`` is asked on the loop that
    reports (asyncio clients are per loop)."""

    async def report(stored: str) -> None:
        done = await progress.save(keys, env.id, env.fence, stored).arun(client())
        if not done.accepted:
            lost()
            raise TaskLost(f"task {env.id}: fence {env.fence} was superseded; progress not saved")

    return report
