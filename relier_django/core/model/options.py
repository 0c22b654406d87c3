"""``@rl_task``'s options under Celery's names: the ones whose meaning matches are
translated, the ones that cannot matter here are accepted and documented as such, and
anything else is a ``TypeError`` naming the nearest option. Pure; no I/O.

See docs/from-celery.md for the whole table.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from . import limits, links

#: Celery's option -> relier's, where the meaning is the same.
ALIASES: Mapping[str, str] = {
    "autoretry_for": "retry_on",
    "soft_time_limit": "soft_timeout",
    "time_limit": "hard_timeout",
}

#: Celery options with nothing to do here, and why (shown by docs/from-celery.md).
NO_OPS: Mapping[str, str] = {
    "acks_late": "relier's store covers a task from push to outcome, whenever it is acked",
    "acks_on_failure_or_timeout": "a failure lands in the DLQ, not back in the queue",
    "reject_on_worker_lost": "a lost worker's task is resurrected, fenced, from the store",
    "ignore_result": "the outcome is always kept for RESULT_TTL_S: idempotency and "
    "receipts read it",
    "store_errors_even_if_ignored": "failures are always kept, in the DLQ",
    "track_started": "the state of a running task is read from the store",
    "trail": "relier keeps no child-task trail",
    "typing": "push() checks the arguments against the signature, always",
    "throws": "every failure is logged once, with its DLQ entry",
}

#: Celery's own names that mean something else here: refused with the reason.
DIFFERENT: Mapping[str, str] = {
    "base": "every @rl_task is a RelierTask",
    "serializer": "relier messages are always JSON envelopes",
}


def translate(given: Mapping[str, Any], own: Iterable[str]) -> dict[str, Any]:
    """Relier's options for the Celery-named ones in ``given``.

    Args:
        given: the options ``@rl_task`` did not recognise by its own names.
        own: relier's option names (for the "did you mean" of an unknown one).

    Raises:
        TypeError: an option that is unknown or means something else here.
    """
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name in ALIASES:
            out[ALIASES[name]] = value
        elif name == "retry_backoff":  # Celery's: True, or a factor in seconds
            out["retry_backoff"] = 1.0 if value is True else value
        elif name == "retry_jitter":  # Celery's: jitter on the autoretry backoff
            if not isinstance(value, bool):
                raise TypeError(f"retry_jitter= takes True or False, got {value!r}")
            out["retry_jitter"] = value
        elif name == "default_retry_delay":  # Celery's: self.retry() without countdown
            out["default_retry_delay"] = _seconds(name, value)
        elif name == "retry_kwargs":
            out["retry_kwargs"] = _retry_kwargs(value)
        elif name in NO_OPS:
            continue
        elif name in DIFFERENT:
            raise TypeError(f"@rl_task option {name!r} is not supported: {DIFFERENT[name]}")
        else:
            known = sorted({*own, *ALIASES, *NO_OPS})
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known options: {known}"
            raise TypeError(f"@rl_task got an unknown option {name!r}{hint}")
    return out


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TypeError(f"{name}= takes seconds (a number >= 0), got {value!r}")
    return float(value)


#: What Celery's ``retry_kwargs`` may hold here: ``retry_on``'s own limit and delay.
_RETRY_KWARGS = ("max_retries", "countdown")


def _retry_kwargs(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise TypeError(f"retry_kwargs= takes a dict, got {value!r}")
    out: dict[str, float] = {}
    for key, item in value.items():
        if key not in _RETRY_KWARGS:
            raise TypeError(
                f"retry_kwargs={{{key!r}: ...}} is not supported: a retry_on retry takes "
                f"{', '.join(_RETRY_KWARGS)} (a retry keeps the task's queue and arguments)"
            )
        if key == "max_retries" and (isinstance(item, bool) or not isinstance(item, int)
                                     or item < 0):  # fmt: skip
            raise TypeError(f"retry_kwargs max_retries takes an int >= 0, got {item!r}")
        out[key] = item if key == "max_retries" else _seconds("retry_kwargs countdown", item)
    return out


def execution_rate(rate: str | None, rate_limit: str | None) -> str | None:
    """The execution rate, from ``rate=`` or Celery's ``rate_limit=`` (the same meaning,
    held across every worker instead of per worker)."""
    if rate is not None and rate_limit is not None:
        raise TypeError("give rate= or rate_limit= (Celery's name for it), not both")
    return rate if rate is not None else rate_limit


#: ``apply_async`` options accepted and not needed: Celery beat passes ``producer`` and a
#: ``headers`` mark; relier retries its own publish, keeps every outcome, routes by queue.
_CALL_NO_OPS = frozenset(
    {"producer", "retry", "retry_policy", "ignore_result", "add_to_parent", "serializer",
     # A chain's bookkeeping: its envelopes carry the workflow themselves.
     "reply_to", "root_id", "parent_id"}
)  # fmt: skip
_BEAT_HEADERS = frozenset({"celery_beat_task", "periodic_task_name"})


def call_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``push``'s options (``task_id``, ``queue``, ``countdown``, ``eta``, ``expires``,
    ``priority``)
    for Celery's ``apply_async`` options.

    Raises:
        TypeError: an option relier cannot honour yet, or one that means something
            else here; never dropped silently.
    """
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name in ("task_id", "queue", "countdown", "eta", "expires", "chain", "group_id",
                    "group_index", "chord", "link", "link_error"):  # fmt: skip
            if value is not None:
                out[name] = value
        elif name == "priority":
            if value is not None:
                out[name] = check_priority(value, "apply_async(priority=...)")
        elif name in ("limit", "concurrency_key"):
            pass  # read together, below
        elif name == "headers":
            extra = set(value or {}) - _BEAT_HEADERS
            if extra:
                raise TypeError(
                    f"apply_async(headers=...) {sorted(extra)}: relier messages carry one "
                    "envelope; pass the values as task arguments"
                )
        elif name == "serializer" and value not in (None, "json"):
            raise TypeError(f"serializer={value!r}: relier messages are always JSON")
        elif name in _CALL_NO_OPS:
            continue
        elif name in ("routing_key", "exchange"):
            raise TypeError(f"apply_async({name}=...): route relier tasks with queue=")
        else:
            raise TypeError(
                f"apply_async({name}=...) is not supported by @rl_task tasks; supported: "
                "task_id, queue, countdown, eta, expires, priority, limit, concurrency_key, "
                f"link, link_error (see {links.doc('from-celery.md')})"
            )
    flow = call_flow(options, "apply_async")
    if flow != (None, None):
        out["flow"] = flow
    return out


def call_flow(options: Mapping[str, Any], where: str) -> tuple[str | None, str | None]:
    """A call's own flow control from its options (``limit=``, ``concurrency_key=``:
    the key itself), checked (``limits.check_call``); (None, None) when it gives none.

    Raises:
        TypeError, ValueError: as ``limits.check_call``.
    """
    return limits.check_call(options.get("limit"), options.get("concurrency_key"), where)


#: Celery's priority range, with RabbitMQ's meaning on every broker: higher runs first.
PRIORITY_MIN, PRIORITY_MAX = 0, 9


def check_priority(value: Any, where: str) -> int:
    """``value`` as a priority: an int from 0 (lowest) to 9 (runs first).

    Raises:
        TypeError: not an int (a bool included).
        ValueError: outside 0..9.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} takes an int from 0 to 9 (9 runs first), got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(
            f"{where} takes {PRIORITY_MIN} to {PRIORITY_MAX} (9 runs first, as on RabbitMQ), "
            f"got {value}"
        )
    return value
