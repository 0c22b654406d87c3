"""``max_resurrections`` by cause of death (issue 40): checked at decoration, written at
push as the text resurrect.lua reads; ``RESURRECTIONS_BY_CAUSE`` for tasks that name no
limit of their own for a cause, checked with the other settings."""

from __future__ import annotations

import pytest

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from relier_django import conf, rl_task
from relier_django.core.model import resurrections
from relier_django.core.model.config import Config
from relier_django.core.model.errors import ConfigError
from relier_django.core.model.resurrections import ResurrectionPolicy


def test_an_integer_is_stored_as_before():
    assert resurrections.stored(resurrections.option(2), 3) == 2
    assert resurrections.stored(None, 3) == 3


def test_a_policy_is_stored_with_its_default_first_and_its_causes_sorted():
    policy = resurrections.option({"ttl_expired": 5, "oom": 0, "default": 2})
    assert resurrections.stored(policy, 3) == "2,oom=0,ttl_expired=5"


def test_a_policy_without_a_default_takes_the_setting_s():
    policy = resurrections.option({"oom": 0})
    assert resurrections.stored(policy, 3) == "3,oom=0"
    assert resurrections.stored(policy, 7) == "7,oom=0"


def test_a_death_takes_its_own_limit_then_its_family_s_then_the_default():
    policy = ResurrectionPolicy.parse({"signal": 1, "signal:SIGSEGV": 0, "default": 4})
    assert policy.limit("signal:SIGSEGV", 3) == 0
    assert policy.limit("signal:SIGKILL", 3) == 1
    assert policy.limit("ttl_expired", 3) == 4
    assert ResurrectionPolicy.parse({"exit": 2}).limit("exit:3", 3) == 2
    assert ResurrectionPolicy.parse({"exit": 2}).limit("oom", 3) == 3


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (
            {"oomkill": 0},
            r"'oomkill' is not a cause of death; e\.g\. max_resurrections=\{\"oom\": 0",
        ),
        ({"signal:kill": 0}, r"'signal:kill' is not a cause of death"),
        ({"oom": -1}, r"\['oom'\] must be an integer >= 0, got -1"),
        ({"oom": True}, r"must be an integer >= 0, got True"),
        ({"default": 1.5}, r"\['default'\] must be an integer >= 0"),
        ("3", r"must be an integer >= 0 or a mapping by cause"),
        (-2, r"must be an integer >= 0, got -2"),
    ],
)
def test_a_wrong_policy_fails_at_decoration_with_what_it_should_look_like(value, error):
    with pytest.raises(ValueError, match=error):

        @rl_task(name="tests.bad_policy", max_resurrections=value)
        def bad() -> None:
            """Never registered: its decoration fails."""


def test_a_decorated_task_keeps_its_policy_in_its_spec():
    @rl_task(name="tests.good_policy", max_resurrections={"oom": 0, "default": 3})
    def good() -> None:
        """Never run."""

    assert good.relier_spec.max_resurrections == ResurrectionPolicy(3, (("oom", 0),))


def test_the_setting_s_limits_apply_where_a_task_names_none_of_its_own():
    settings = Config(max_resurrections=4, resurrections_by_cause=("oom=0",)).resurrection_policy()
    assert resurrections.stored(None, settings) == "4,oom=0"
    # A task's own mapping wins for the causes it names, and for the default if it names it.
    own = resurrections.option({"oom": 2, "signal": 1})
    assert resurrections.stored(own, settings) == "4,oom=2,signal=1"
    assert resurrections.stored(resurrections.option({"default": 9}), settings) == "9,oom=0"
    # A task's own integer is its limit for every cause.
    assert resurrections.stored(5, settings) == 5
    assert resurrections.stored(None, Config().resurrection_policy()) == 3


def test_the_setting_reaches_the_config_from_the_settings_dict_and_the_environment(
    settings, monkeypatch
):
    settings.RELIER = {"RESURRECTIONS_BY_CAUSE": {"oom": 0, "signal:SIGSEGV": 1}}
    assert conf.get_config().resurrection_policy() == ResurrectionPolicy(
        3, (("oom", 0), ("signal:SIGSEGV", 1))
    )
    monkeypatch.setenv("RELIER_RESURRECTIONS_BY_CAUSE", "ttl_expired=6")
    conf.get_config.cache_clear()
    assert conf.get_config().resurrection_policy() == ResurrectionPolicy(3, (("ttl_expired", 6),))


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        (("oomkill=0",), r"resurrections_by_cause: 'oomkill' is not a cause of death"),
        (("oom=-1",), r"'oom=-1' is not 'cause=N' with N >= 0"),
        (("default=2",), r"the limit of every other cause is MAX_RESURRECTIONS"),
        (("oom",), r"'oom' is not 'cause=N'"),
    ],
)
def test_a_wrong_setting_is_refused_with_what_it_should_look_like(entries, error):
    with pytest.raises(ConfigError, match=error):
        Config(resurrections_by_cause=entries)


@task(max_resurrections={"oom": 0, "default": 2})
def quarantined_job() -> None:
    """A django.tasks task with limits by cause; never run."""


def wrong_job() -> None:
    """Given a policy with a cause that is not one; never declared."""


def test_a_django_task_s_policy_is_checked_and_kept_hashable():
    assert quarantined_job.max_resurrections == ResurrectionPolicy(2, (("oom", 0),))
    assert hash(quarantined_job)  # a Task is a frozen dataclass: a dict would not hash
    with pytest.raises(ValueError, match=r"@task\(max_resurrections=\.\.\.\): 'oomz' is not"):
        task(max_resurrections={"oomz": 0})(wrong_job)
