"""Flow control as the Django layer sees it: the core's reading of the scopes in use
(``core.observe.limits``) wired to the settings and the project's Celery app, which
knows each task's own rate; and the named limits the settings define, in use or not.

The admin's "Flow control" pages and ``manage.py relier_status`` read through here
(docs/flow-control.md, "Seeing it").
"""

from __future__ import annotations

from celery import current_app

from .. import conf
from ..core.model.limits import NamedLimit, TaskLimits
from ..core.model.rates import Rate
from ..core.observe.limits import Holder, Limits, ParkedKey, Scope, family_of
from ..core.observe.limits import read as _read
from ..core.store.connection import sync_client

__all__ = ["Holder", "Limits", "ParkedKey", "Scope", "family_of", "named", "read", "task_rates"]


def task_rates() -> dict[str, Rate]:
    """The rate of each family a task's own ``rate=`` sets (``t:<task>``, or its named
    limit's ``n:<name>`` when the task overrides that limit's rate)."""
    found: dict[str, Rate] = {}
    for name, task in list(current_app._get_current_object().tasks.items()):
        limits = getattr(getattr(task, "relier_spec", None), "limits", None)
        if isinstance(limits, TaskLimits) and limits.rate is not None:
            found[f"n:{limits.limit}" if limits.limit else f"t:{name}"] = limits.rate
    return found


def read() -> Limits:
    """Every scope in use in the configured store; see ``core.observe.limits.read``."""
    cfg = conf.get_config()
    return _read(sync_client(cfg), cfg, task_rates())


def named() -> list[NamedLimit]:
    """The named limits of ``RELIER["LIMITS"]``, by name."""
    return sorted(conf.get_config().named_limits().values(), key=lambda n: n.name)
