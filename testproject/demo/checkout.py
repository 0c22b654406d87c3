"""The crash-point example (docs/crash-testing.md): a checkout that charges a payment
gateway and records the order, written twice.

``FakeGateway`` is the "external" service: every call is one charge, a ``Booking`` row
labelled ``charge:<order>`` written in its own autocommit, with no idempotency key, so
a call made twice charges twice. ``checkout_planted`` carries the bug: it charges
before its inbox unit, so an incarnation killed after the charge (at the unit's
commit, or before ``commit.lua``) leaves a charge its successor makes again.
``checkout_fixed`` charges inside the unit: the charge commits with the order and the
inbox row, exactly once.
"""

from __future__ import annotations

from relier_django import TaskContext, rl_task
from relier_django.inbox import once


class FakeGateway:
    """Charges as a payment provider without idempotency keys would: once per call."""

    @staticmethod
    def charge(order: str) -> None:
        from testproject.demo.models import Booking

        Booking.objects.create(label=f"charge:{order}", fence=0)


def _record_order(ctx: TaskContext, order: str) -> None:
    from testproject.demo.models import Booking

    Booking.objects.create(label=f"order:{order}", fence=ctx.fence_token)


@rl_task(name="demo.checkout_planted")
def checkout_planted(ctx: TaskContext, order: str) -> dict[str, str]:
    """The planted bug: the charge is outside the unit, so it is not undone with it."""
    ctx.set_partial({"order": order})
    FakeGateway.charge(order)
    with once(ctx) as unit:
        if not unit.done:
            _record_order(ctx, order)
            unit.result = {"order": order}
    return unit.result  # type: ignore[no-any-return]


@rl_task(name="demo.checkout_fixed")
def checkout_fixed(ctx: TaskContext, order: str) -> dict[str, str]:
    """The fix: the charge commits in the unit's transaction, with the order."""
    ctx.set_partial({"order": order})
    with once(ctx) as unit:
        if not unit.done:
            FakeGateway.charge(order)
            _record_order(ctx, order)
            unit.result = {"order": order}
    return unit.result  # type: ignore[no-any-return]


@rl_task(name="demo.checkout_notify")
async def checkout_notify(ctx: TaskContext, order: str) -> dict[str, str]:
    """An ``async def`` step of the example: a checkpoint, then a push (the notice runs
    as its own task), then the commit: the boundaries of the async path."""
    from testproject.demo.tasks import sync_record

    await ctx.aset_partial({"order": order})
    await sync_record.apush(f"notice:{order}")
    return {"order": order}
