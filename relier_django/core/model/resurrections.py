"""``max_resurrections`` by cause of death: a limit per cause, chosen by how the holder
died, so an OOM loop can be quarantined at once while a lost host is retried.

The decision is made in ``resurrect.lua``, which has the death at hand; it reads the
policy from the task hash's ``maxres`` field, written at push as this module encodes it.
A plain integer is written as before (``"3"``), so a task without a policy stores what it
always stored and a hash written by an older version reads the same. A policy is
``"<default>,<cause>=<n>,..."`` (``"3,oom=0,signal:SIGSEGV=1"``): the first number is the
limit for every cause not named. Causes contain no ``,`` or ``=``, so the text needs no
escaping. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT = "default"
# What a death can be called (resurrect.lua's 'death', exits.py): each exact name, and
# the families 'signal' and 'exit' that cover every 'signal:<NAME>' and 'exit:<code>'.
CAUSES: frozenset[str] = frozenset(
    {"oom", "signal", "exit", "pool_death", "connection_closed", "ttl_expired", "drain",
     "unsent"}
)  # fmt: skip
_SPECIFIC = re.compile(r"signal:(SIG[A-Z0-9]+|\d+)|exit:-?\d+")
_HINT = (
    'e.g. max_resurrections={"oom": 0, "default": 3}; a cause is one of '
    + ", ".join(sorted(CAUSES))
    + ', "signal:<NAME>" (signal:SIGSEGV) or "exit:<code>" (exit:3), or "default"'
)


@dataclass(frozen=True, slots=True)
class ResurrectionPolicy:
    """Limits by cause: a death of cause ``c`` is resurrected only while the task has
    been resurrected fewer times (deaths of any cause) than the limit for ``c``: its own
    (``signal:SIGSEGV``), else its family's (``signal``), else ``default``. A task's
    policy leaves ``default`` None to take the settings' (:func:`stored` merges it with
    ``RESURRECTIONS_BY_CAUSE`` and ``MAX_RESURRECTIONS``)."""

    default: int | None
    by_cause: tuple[tuple[str, int], ...]  # sorted pairs: a spec stays hashable

    @classmethod
    def parse(
        cls, value: Mapping[str, int], where: str = "max_resurrections"
    ) -> ResurrectionPolicy:
        """Read ``{"oom": 0, "default": 3}``.

        Raises:
            ValueError: a key is not a cause, or a limit is not an integer >= 0.
        """
        pairs: dict[str, int] = {}
        for cause, limit in value.items():
            if not isinstance(cause, str) or not (cause in CAUSES or cause == DEFAULT or
                                                  _SPECIFIC.fullmatch(cause)):  # fmt: skip
                raise ValueError(f"{where}: {cause!r} is not a cause of death; {_HINT}")
            pairs[cause] = checked_limit(limit, f"{where}[{cause!r}]")
        default = pairs.pop(DEFAULT, None)
        return cls(default, tuple(sorted(pairs.items())))

    def limit(self, death: str, fallback: int) -> int:
        """The limit that applies to a death of cause ``death`` (``resurrect.lua``'s
        rule, for Python readers)."""
        found = dict(self.by_cause)
        family = death.partition(":")[0]
        for name in (death, family):
            if name in found:
                return found[name]
        return fallback if self.default is None else self.default

    def encoded(self, fallback: int) -> str:
        """The ``maxres`` text ``resurrect.lua`` reads."""
        head = str(fallback if self.default is None else self.default)
        return ",".join([head, *(f"{cause}={n}" for cause, n in self.by_cause)])


MaxResurrections = int | ResurrectionPolicy


def checked_limit(value: object, where: str = "max_resurrections") -> int:
    """``value`` as a limit, or ValueError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be an integer >= 0, got {value!r}")
    return value


def option(value: object, where: str = "max_resurrections") -> MaxResurrections | None:
    """``@rl_task(max_resurrections=...)`` checked at decoration: ``None``, an integer
    for every cause, or a mapping of limits by cause.

    Raises:
        ValueError: anything else, with what it should look like.
    """
    if value is None or isinstance(value, ResurrectionPolicy):
        return value
    if isinstance(value, Mapping):
        return ResurrectionPolicy.parse(value, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer >= 0 or a mapping by cause; {_HINT}")
    return checked_limit(value, where)


def stored(value: MaxResurrections | None, settings: MaxResurrections) -> int | str:
    """What push writes as the task's ``maxres``: an integer as before, or a policy's
    text. ``settings``: ``Config.resurrection_policy()`` (``MAX_RESURRECTIONS`` and
    ``RESURRECTIONS_BY_CAUSE``), or a bare ``MAX_RESURRECTIONS``.

    A task's own integer is its limit for every cause; a task's own policy names some
    causes and takes the settings' limits for the others (and their default, unless it
    names ``"default"``); a task without either takes the settings'."""
    if isinstance(value, int):
        return value
    if isinstance(settings, int):
        settings = ResurrectionPolicy(settings, ())
    by_cause, default = dict(settings.by_cause), settings.default
    if value is not None:
        by_cause |= dict(value.by_cause)
        default = default if value.default is None else value.default
    default = 0 if default is None else default
    if not by_cause:
        return default  # stored as it always was
    return ResurrectionPolicy(default, tuple(sorted(by_cause.items()))).encoded(default)
