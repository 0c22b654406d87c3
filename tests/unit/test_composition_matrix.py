"""The composition matrix's choice of cells (tests/composition/sampling.py, the matrix of
tests/chaos/test_composition.py): nothing left out without its reason, and a sample
that covers every value of every axis, the same for the same seed."""

from __future__ import annotations

import itertools

import pytest

from testproject.demo import composition_tasks as tasks
from tests.chaos.test_composition import FATES, MATRIX
from tests.composition.sampling import Plan, covering_sample


def test_every_cell_is_run_or_left_out_with_its_reason():
    axes = MATRIX.axes()
    every = 1
    for values in axes.values():
        every *= len(values)
        assert len({v.name for v in values}) == len(values)  # names are unique
    left_out = MATRIX.left_out()
    assert len(MATRIX.cells) + len(left_out) == every
    assert left_out and all(reason for _, reason in left_out)
    for exclusion in MATRIX.excluded:  # each names real values, and leaves something out
        for axis in exclusion.where:
            assert set(exclusion.names(axis)) <= {v.name for v in axes[axis]}, axis
        assert any(exclusion.matches(cell) for cell, _ in left_out)


@pytest.mark.parametrize("seed", [1, 7, 2024])
def test_a_sample_covers_every_value_of_every_axis_and_repeats_with_its_seed(seed):
    chosen = MATRIX.chosen(Plan(seed, 24))
    assert len(chosen) == len(set(chosen)) == 24
    assert set(chosen) <= set(MATRIX.cells)
    for axis, values in MATRIX.axes().items():
        assert {getattr(cell, axis) for cell in chosen} == set(values), axis
    assert MATRIX.chosen(Plan(seed, 24)) == chosen
    assert MATRIX.chosen(Plan(seed + 1, 24)) != chosen


def test_all_takes_every_cell_and_a_sample_too_small_to_cover_is_refused():
    assert MATRIX.chosen(Plan(3, None)) == MATRIX.cells
    with pytest.raises(ValueError, match="cannot cover"):
        MATRIX.chosen(Plan(3, 5))


def test_after_every_value_a_sample_takes_the_pairs_not_yet_met():
    cells = list(itertools.product("abc", "xyz", "01"))
    chosen = covering_sample(cells, 9, seed=5)
    pairs = {p for c in chosen for p in itertools.combinations(enumerate(c), 2)}
    # 9 + 6 + 6 pairs exist; nine cells of three pairs each can meet them all.
    assert len(pairs) >= 19


def test_a_held_run_waits_longer_than_any_bound():
    assert max(fate.bound_s for fate in FATES) < tasks.HOLD_S
