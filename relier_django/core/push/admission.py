"""Admission control on push: fixed-window counters, checked and counted atomically.

A push is admitted only if every counter that applies has room: the global one
(``admission_limit``) and its task's (``admission_task_limits``, else
``@rl_task(admission_limit=...)``). The check and the count run inside ``push.lua`` itself,
so an admitted push costs no extra round trip and a refused one stores, sends and
counts nothing. ``admit.lua`` runs the same check alone, for callers that want to
know before they start work: ``check`` on any client, ``acheck`` on the event loop's
pipelined connection (the fast path, see ``pipelined``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model import rates
from ..model.config import Config
from ..model.rates import Rate
from ..store import pipelined, scripts
from ..store.connection import async_client
from ..store.keys import KeySpace


@dataclass(frozen=True, slots=True)
class Limit:
    """One admission counter and the rate it enforces."""

    key: str
    rate: Rate


@functools.lru_cache(maxsize=16)
def _task_limits(config: Config) -> dict[str, Rate]:
    return config.task_admission_limits()


def limits(
    keys: KeySpace, config: Config, task_name: str, own_rate: Rate | None
) -> tuple[Limit, ...]:
    """The counters a push of ``task_name`` must pass, global first. ``own_rate`` is
    the task's ``@rl_task(admission_limit=...)``; a setting for that task wins over it."""
    found: list[Limit] = []
    if config.admission_limit is not None:
        found.append(Limit(keys.admission_all, rates.parse(config.admission_limit)))
    rate = _task_limits(config).get(task_name) or own_rate
    if rate is not None:
        found.append(Limit(keys.admission_task(task_name), rate))
    return tuple(found)


def script_args(found: Sequence[Limit]) -> list[scripts.Arg]:
    """The admission part of push.lua's ARGV: n, then limit and window (ms) per counter."""
    args: list[scripts.Arg] = [len(found)]
    for limit in found:
        args += [limit.rate.limit, limit.rate.window_ms]
    return args


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    retry_after_s: float  # 0.0 when admitted


def _admission(reply: Sequence[Any]) -> Admission:
    return Admission(int(reply[0]) == 1, int(reply[1]) / 1000)


def check(found: Sequence[Limit]) -> scripts.ScriptCall[Admission]:
    """admit.lua: admit (and count) one unit of work on ``found``, or say when to retry."""
    args = script_args(found)[1:]
    return scripts.ScriptCall(scripts.ADMIT, [f.key for f in found], args, _admission)


async def acheck(found: Sequence[Limit], config: Config) -> Admission:
    """Admit (and count) one unit of work on ``found``, from async code.

    Concurrent callers on one event loop share one pipelined connection, so a check
    costs about one loopback round trip however many run at once. Not retried: a
    ``redis.exceptions.ConnectionError`` or ``TimeoutError`` means the outcome is
    unknown (the unit may have been counted, which only ever errs towards refusing).
    """
    call = _check_cached(tuple(found))
    if config.cluster:
        # The pipelined connection goes to one server; a cluster's {adm} slot may be
        # served by another. Its fail-fast client makes one attempt too.
        return await call.arun(async_client(config, fail_fast=True))
    conn = await pipelined.for_loop(config)
    return call.parse(await conn.run_script(call.script, call.keys, call.args))


_check_cached = functools.lru_cache(maxsize=256)(check)
