"""Task schema versions: migrations are declared safely (G6) and an envelope that
cannot be brought up to date is a SchemaMismatch with the way out, never a
TypeError in the task (G5)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from relier_django import rl_task
from relier_django.core.model.schema import Schema, SchemaMismatch
from relier_django.core.model.spec import TaskSpec
from relier_django.core.push import producer


def v1_to_v2(args, kwargs):
    # v1: (order_id, cents)  ->  v2: (order_id, amount: str)
    order_id, cents = args
    return [order_id, f"{cents / 100:.2f}"], kwargs


def v2_to_v3(args, kwargs):
    # v3 adds a required currency
    return args, {**kwargs, "currency": "EUR"}


def charge_v3(order_id: str, amount: str, currency: str) -> None: ...


V3 = Schema(3, {1: v1_to_v2, 2: v2_to_v3})


def test_an_old_call_is_upgraded_step_by_step_in_order():
    call = V3.upgrade("shop.charge", 1, ("o-1", 1250), {})
    assert (call.args, call.kwargs, call.migrated_from) == (
        ("o-1", "12.50"),
        {"currency": "EUR"},
        1,
    )
    assert V3.upgrade("shop.charge", 2, ("o-1", "3.00"), {}).kwargs == {"currency": "EUR"}


def test_a_current_call_is_not_migrated():
    call = V3.upgrade("shop.charge", 3, ["o-1", "1.00"], {"currency": "USD"})
    assert (call.args, call.migrated_from) == (("o-1", "1.00"), None)


def test_migrations_get_copies_so_the_envelope_is_never_changed():
    def mutate(args, kwargs):
        args[0]["seen"] = True
        kwargs["items"].append(3)
        return args, kwargs

    args, kwargs = ({"id": 1},), {"items": [1, 2]}
    Schema(2, {1: mutate}).upgrade("t", 1, args, kwargs)
    assert args == ({"id": 1},) and kwargs == {"items": [1, 2]}


def test_a_newer_envelope_says_deploy_everywhere_then_release():
    with pytest.raises(SchemaMismatch) as err:
        Schema(2, {1: v1_to_v2}).check("shop.charge", 3)
    message = str(err.value)
    assert "envelope schema v3 > this worker's v2 of shop.charge" in message
    assert "Deploy the new code to every worker, then release it" in message
    assert "relier_dlq release" in message
    assert (err.value.envelope_version, err.value.worker_version) == (3, 2)


def test_a_retired_version_has_no_path_and_says_how_to_add_one():
    with pytest.raises(SchemaMismatch, match=r"v1 of t has no migration path to v3.*\[1\]"):
        Schema(3, {2: v2_to_v3}).upgrade("t", 1, (), {})


def test_a_migration_that_raises_is_a_mismatch_with_its_cause():
    def broken(args, kwargs):
        raise KeyError("cents")

    with pytest.raises(SchemaMismatch, match=r"migration v1→v2 of t raised KeyError") as err:
        Schema(2, {1: broken}).upgrade("t", 1, (), {})
    assert isinstance(err.value.__cause__, KeyError)


@pytest.mark.parametrize("returned", [None, ["a"], ("a", {}), ([], {1: "x"}), ([], {}, {})])
def test_a_migration_must_return_args_and_kwargs(returned):
    with pytest.raises(SchemaMismatch, match=r"returned .*a migration returns \(args, kwargs\)"):
        Schema(2, {1: lambda a, k: returned}).upgrade("t", 1, (), {})


def test_arguments_that_do_not_fit_after_migrating_name_the_migration():
    call = Schema(2, {1: lambda a, k: (a, k)}).upgrade("shop.charge", 1, ("o-1",), {})
    with pytest.raises(SchemaMismatch, match=r"after migrating v1→v2 do not fit shop\.charge\("):
        Schema(2, {1: lambda a, k: (a, k)}).fit("shop.charge", inspect.signature(charge_v3), call)


def test_a_signature_changed_without_a_version_bump_says_so():
    call = Schema().upgrade("shop.charge", 1, ("o-1", 100), {})
    with pytest.raises(SchemaMismatch, match=r"bump @rl_task\(version=\) and add a migration"):
        Schema().fit("shop.charge", inspect.signature(charge_v3), call)


@pytest.mark.parametrize(
    ("version", "migrations", "error", "match"),
    [
        (0, {}, ValueError, "version must be >= 1"),
        (True, {}, TypeError, "version must be an int"),
        (2, {2: v1_to_v2}, ValueError, r"keys are ints in 1\.\.1"),
        (3, {0: v1_to_v2, 2: v2_to_v3}, ValueError, r"keys are ints in 1\.\.2"),
        (4, {1: v1_to_v2, 3: v2_to_v3}, ValueError, r"hole: no step from v2 to v3"),
        (2, {1: "v1_to_v2"}, TypeError, "must be callable"),
    ],
)
def test_bad_declarations_are_refused_when_the_task_is_declared(version, migrations, error, match):
    with pytest.raises(error, match=match):

        @rl_task(name="t.schema_bad", version=version, migrations=migrations)
        def task(order_id: str) -> None: ...


def test_retiring_the_oldest_versions_is_allowed():
    assert Schema(4, {2: v1_to_v2, 3: v2_to_v3}).oldest == 2


def test_a_push_carries_the_producers_schema_version():
    spec = TaskSpec(name="shop.charge", fn=charge_v3, schema=V3)
    assert producer.prepare(spec, ("o-1", "1.00", "EUR"), {}).schema_version == 3
    assert producer.prepare(TaskSpec(name="t", fn=lambda: None), (), {}).schema_version == 1


def test_a_spec_with_migrations_stays_hashable():
    spec = TaskSpec(name="shop.charge", fn=charge_v3, schema=V3)
    assert hash(spec) == hash(dataclasses.replace(spec))


def test_fit_judges_each_shape_of_call_alike_cached_or_not():
    import inspect

    from relier_django.core.model.schema import Call, Schema, SchemaMismatch

    def task(ctx, a, b=[], *, c):  # noqa: B006  (an unhashable default: not cacheable)
        return a

    def hashable(a, b=1, *, c):
        return a

    schema = Schema()
    for fn in (task, hashable):
        sig = inspect.signature(fn)
        if fn is task:
            sig = sig.replace(parameters=list(sig.parameters.values())[1:])
        for _ in range(2):  # the second time from the cache, where there is one
            schema.fit("t", sig, Call((1,), {"c": 3}))
            schema.fit("t", sig, Call((1, 2), {"c": 3}))
            with pytest.raises(SchemaMismatch, match="missing a required argument: 'c'"):
                schema.fit("t", sig, Call((1,), {}))
            with pytest.raises(SchemaMismatch, match="unexpected keyword argument 'd'"):
                schema.fit("t", sig, Call((1,), {"c": 3, "d": 4}))
