"""Flow control's pure parts (model/limits.py): options checked at decoration, named
limits read from the settings, the gate a push goes through; and the key names
_limits.lua builds itself, which must stay the ones keys.py gives."""

from __future__ import annotations

import inspect

import pytest

from relier_django.core.model import limits
from relier_django.core.model.errors import ConfigError
from relier_django.core.store.keys import KeySpace


def _sig(customer: str, label: str = "") -> None: ...


SIG = inspect.signature(_sig)


def test_lua_derives_the_store_s_key_names_as_keys_py_gives_them():
    """_limits.lua names the schedule index, its wake-up list and a task's hash from
    the expiry index's name (limit_prefix strips ':expiry'): keys.py must agree."""
    keys = KeySpace("rl")
    prefix = keys.expiry[: -len(":expiry")]
    assert keys.schedule == prefix + ":sched"
    assert keys.schedule_wake == prefix + ":sched:wake"
    assert keys.task("abc") == prefix + ":t:{abc}"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"concurrency": 0}, "int >= 1"),
        ({"concurrency": True}, "int >= 1"),
        ({"concurrency_key": "customer"}, "needs concurrency="),
        ({"concurrency": 2, "limit": "stripe"}, "not both"),
        ({"rate": "fast"}, "a rate looks like"),
        ({"limit": "a|b"}, "RELIER\\['LIMITS'\\] entry"),
    ],
)
def test_bad_options_are_refused_at_decoration(kwargs, error):
    given = {"concurrency": None, "concurrency_key": None, "limit": None, "rate": None, **kwargs}
    with pytest.raises((ValueError, TypeError), match=error):
        limits.check_options(**given)


def test_a_key_naming_no_argument_is_refused_at_decoration():
    flow = limits.check_options(2, "tenant", None, None)
    with pytest.raises(ValueError, match="names no argument of the task"):
        limits.check_key_argument(flow, SIG, "t")


def test_named_limits_read_from_the_settings_dict_form():
    found = limits.named_limits(['stripe={"concurrency": 5, "rate": "100/s"}',
                                 'sms={"rate": "10/s", "per_key": true}'])  # fmt: skip
    assert found["stripe"].concurrency == 5 and found["stripe"].rate.limit == 100
    assert found["sms"].per_key and found["sms"].concurrency is None
    for bad, error in [
        ('x={"concurrency": 0}', "int >= 1"),
        ('x={"burst": 3, "rate": "1/s"}', "unknown keys"),
        ("x={}", "non-empty dict"),
        ('x={"per_key": true}', "needs a concurrency or a rate"),
        ("x=5", "non-empty dict"),
        ("x=not json", "is not a limit"),
    ]:
        with pytest.raises(ConfigError, match=error):
            limits.named_limits([bad])


def test_a_per_key_concurrency_gives_each_key_its_own_scope():
    flow = limits.check_options(2, "customer", None, None)
    gate = limits.gate_of("t", flow, {}, SIG, ("acme",), {"label": "x"})
    assert gate == limits.Gate("t:t|acme", "", 2, "", 0, 0)


def test_a_shared_named_limit_keeps_one_scope_and_parks_by_key():
    named = limits.named_limits(['stripe={"concurrency": 5, "rate": "10/s"}'])
    flow = limits.check_options(None, lambda customer, label="": customer.upper(), "stripe", None)
    gate = limits.gate_of("t", flow, named, SIG, ("acme",), {})
    # 10/s: one every 100 ms, a burst of the window's 10 (9 intervals ahead).
    assert gate == limits.Gate("n:stripe", "ACME", 5, "n:stripe", 100, 900)


def test_a_per_key_named_limit_scopes_slots_and_rate_by_key():
    named = limits.named_limits(['sms={"concurrency": 1, "per_key": true}'])
    flow = limits.check_options(None, "customer", "sms", "2/s")
    gate = limits.gate_of("t", flow, named, SIG, ("acme",), {})
    assert gate == limits.Gate("n:sms|acme", "", 1, "n:sms|acme", 500, 500)


def test_keys_that_cannot_name_a_redis_key_are_refused_at_push():
    flow = limits.check_options(1, "customer", None, None)
    for bad in ("", "x" * 129, "a|b", "tab\there", None, 1.5, True):
        with pytest.raises(ValueError, match="concurrency key"):
            limits.gate_of("t", flow, {}, SIG, (bad,), {})
    assert limits.gate_of("t", flow, {}, SIG, (42,), {}).scope == "t:t|42"


def test_an_undefined_named_limit_is_a_config_error_naming_the_fix():
    flow = limits.check_options(None, None, "stripe", None)
    with pytest.raises(ConfigError, match=r'RELIER\["LIMITS"\] = \{"stripe"'):
        limits.gate_of("t", flow, {}, SIG, ("a",), {})


def test_a_call_s_limit_replaces_the_task_s_and_its_key_replaces_the_derived_one():
    named = limits.named_limits(['sms={"concurrency": 1, "per_key": true}',
                                 'stripe={"concurrency": 5}'])  # fmt: skip
    own = limits.check_options(2, "customer", None, "10/s")
    # The call's limit: the task's concurrency and rate are gone, its key derivation kept.
    assert limits.gate_of("t", own, named, SIG, ("acme",), {}, "sms") == limits.Gate(
        "n:sms|acme", "", 1, "", 0, 0
    )
    # The call's key: the argument is not read.
    assert limits.gate_of("t", own, named, SIG, ("acme",), {}, None, "k9").scope == "t:t|k9"
    # A task with none: the call's limit alone gates it, shared by its keys.
    bare = limits.TaskLimits()
    gate = limits.gate_of("t", bare, named, SIG, ("acme",), {}, "stripe", "k9")
    assert gate == limits.Gate("n:stripe", "k9", 5, "", 0, 0)
    with pytest.raises(ValueError, match="keys nothing"):
        limits.gate_of("t", bare, named, SIG, ("acme",), {}, None, "k9")
    with pytest.raises(ConfigError, match="limit='nope' is not in"):
        limits.gate_of("t", bare, named, SIG, ("acme",), {}, "nope")


def test_a_call_s_limit_and_key_are_checked_at_the_call():
    assert limits.check_call(None, None, "w") == (None, None)
    assert limits.check_call("sms", 42, "w") == ("sms", "42")
    for bad_limit, error in ((5, TypeError), ("a|b", ValueError), ("", ValueError)):
        with pytest.raises(error, match="limit="):
            limits.check_call(bad_limit, None, "w")
    for bad_key, error in ((1.5, TypeError), (True, TypeError), ("x" * 129, ValueError),
                           ("a|b", ValueError), ("", ValueError)):  # fmt: skip
        with pytest.raises(error, match="concurrency"):
            limits.check_call("sms", bad_key, "w")


def test_a_task_without_flow_control_has_no_gate():
    assert limits.gate_of("t", limits.TaskLimits(), {}, SIG, ("a",), {}) is None


def test_the_readers_flow_control_key_names_are_the_ones_limits_lua_builds():
    """_limits.lua names a scope's keys itself (limit_key: '<P>:lim:<scope>:<what>'); the
    reader (observe/limits.py) finds them by keys.py's names: every kind the script
    builds must be one keys.py names the same way."""
    import re
    from pathlib import Path

    import relier_django.core.store as store

    lua = (Path(store.__file__).parent / "lua" / "_limits.lua").read_text()
    assert "return prefix .. ':lim:' .. scope .. ':' .. what" in lua
    built = set(re.findall(r"limit_key\([^,()]+,\s*[^,()]+,\s*'([a-z]+:?)'", lua))
    assert built == {"run", "ring", "w:", "tat"}
    keys = KeySpace("rl")
    prefix = keys.expiry[: -len(":expiry")]
    scope = "t:app.charge|cust:7"
    named = {
        "run": keys.limit_run(scope),
        "ring": keys.limit_ring(scope),
        "w:": keys.limit_parked(scope, "cust:7"),
        "tat": keys.limit_rate(scope),
    }
    for what, name in named.items():
        tail = "cust:7" if what == "w:" else ""
        assert name == f"{prefix}:lim:{scope}:{what}{tail}"
    assert keys.limit_pattern() == f"{prefix}:lim:*"
    # The two indexes readers list the scopes from, as the script names them.
    assert "prefix .. ':lim_scopes'" in lua and keys.limit_scopes == f"{prefix}:lim_scopes"
    assert "prefix .. ':lim_rates'" in lua and keys.limit_rates == f"{prefix}:lim_rates"


def test_a_scope_s_family_drops_its_key_only():
    from relier_django.core.observe.limits import family_of

    assert family_of("t:app.charge|cust:7") == "t:app.charge"
    assert family_of("n:stripe") == "n:stripe"
    assert family_of("n:sms|tenant|x") == "n:sms"
