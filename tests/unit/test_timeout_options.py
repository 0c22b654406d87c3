"""G6: timeouts that cannot work are refused when the task is declared, saying why."""

from __future__ import annotations

import pytest

from relier_django import rl_task


def test_a_plain_def_task_gets_its_timeouts_as_celerys_own_time_limits():
    @rl_task(name="t.plain_timeout", soft_timeout=3, hard_timeout=5)
    def plain() -> None: ...

    assert (plain.soft_time_limit, plain.time_limit) == (3, 5)


def test_a_soft_hook_on_a_plain_def_task_is_refused_with_the_way_out():
    def hook(ctx: object) -> None: ...

    with pytest.raises(ValueError, match=r"on_soft_timeout= needs an `async def` task.*catch it"):

        @rl_task(name="t.plain_hook", soft_timeout=3, hard_timeout=5, on_soft_timeout=hook)
        def plain() -> None: ...


def test_a_soft_timeout_at_or_above_the_hard_one_is_refused():
    with pytest.raises(ValueError, match=r"soft_timeout \(5\) must be below hard_timeout \(5\)"):

        @rl_task(name="t.soft_hard", soft_timeout=5, hard_timeout=5)
        async def task() -> None: ...


@pytest.mark.parametrize("value", [0, -1])
def test_a_timeout_must_be_positive(value):
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        rl_task(name="t.zero", hard_timeout=value)


def test_a_soft_hook_needs_a_soft_timeout():
    with pytest.raises(ValueError, match="needs soft_timeout"):
        rl_task(name="t.hook", hard_timeout=3, on_soft_timeout=lambda ctx: None)
