"""Which cells of the composition matrix a run takes, and the seed that chose them.

CI runs a sample (``CHAOS_COMPOSITION_SAMPLE``, 24 by default); ``make chaos`` runs the
whole matrix (``CHAOS_COMPOSITION_SAMPLE=all``). A sample is a covering one: first
every value of every axis at least once, then as many new pairs of values (of two
axes) as each further cell adds, ties broken by the seed; so each run exercises every
feature and, over runs, every pair meets. The seed is printed in the session's header
and in every failure; ``CHAOS_COMPOSITION_SEED=<seed>`` repeats a run's choice.

The variables are not ``RELIER_*`` ones: relier reads every ``RELIER_*`` variable as a
setting and reports the unknown ones (``manage.py check``), in every process.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

SEED_ENV = "CHAOS_COMPOSITION_SEED"
SAMPLE_ENV = "CHAOS_COMPOSITION_SAMPLE"
DEFAULT_SAMPLE = 24

Cell = tuple[Hashable, ...]  # one value per axis


@dataclass(frozen=True)
class Plan:
    """A run's choice: ``size`` cells (None: every cell), chosen with ``seed``."""

    seed: int
    size: int | None

    def repeat(self) -> str:
        """The environment that repeats this run's choice."""
        return f"{SEED_ENV}={self.seed} {SAMPLE_ENV}={self.size or 'all'}"


@functools.cache
def plan() -> Plan:
    """This process's plan, from the environment; a seed is drawn when none is given
    (once per process, so the header and the test agree)."""
    raw_seed = os.environ.get(SEED_ENV, "").strip()
    seed = int(raw_seed) if raw_seed else random.SystemRandom().randrange(1, 10**6)
    raw_size = os.environ.get(SAMPLE_ENV, "").strip().lower() or str(DEFAULT_SAMPLE)
    size = None if raw_size == "all" else int(raw_size)
    if size is not None and size < 1:
        raise ValueError(f"{SAMPLE_ENV} must be a positive number or 'all', got {raw_size!r}")
    return Plan(seed, size)


def _features(cell: Cell, order: int) -> set[tuple[tuple[int, Hashable], ...]]:
    return set(itertools.combinations(enumerate(cell), order))


def covering_sample(cells: Sequence[Cell], size: int | None, seed: int) -> list[Cell]:
    """``size`` of ``cells`` covering every value of every axis (all of them when
    ``size`` is None or not smaller), in the order of ``cells``.

    Raises:
        ValueError: ``size`` is too small to hold every value of some axis.
    """
    if size is None or size >= len(cells):
        return list(cells)
    values = [{cell[i] for cell in cells} for i in range(len(cells[0]))]
    widest = max(len(v) for v in values)
    if size < widest:
        raise ValueError(f"a sample of {size} cannot cover an axis of {widest} values")
    pool = list(cells)
    random.Random(seed).shuffle(pool)
    chosen: list[Cell] = []
    for order in (1, 2):  # every value, then as many pairs as fit
        covered = set().union(*(_features(c, order) for c in chosen)) if chosen else set()
        while len(chosen) < size:
            rest = [c for c in pool if c not in chosen]
            # max() keeps the first of equals: the shuffled order breaks ties.
            best = max(rest, key=lambda c: len(_features(c, order) - covered))
            if not _features(best, order) - covered:
                break
            chosen.append(best)
            covered |= _features(best, order)
    if set().union(*(_features(c, 1) for c in chosen)) != set().union(
        *(_features(c, 1) for c in cells)
    ):
        raise ValueError(f"a sample of {size} cells cannot cover every value of every axis")
    chosen += [c for c in pool if c not in chosen][: size - len(chosen)]
    position = {cell: i for i, cell in enumerate(cells)}
    return sorted(chosen, key=position.__getitem__)
