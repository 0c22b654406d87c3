"""Every Relier admin page and every management command answers an unreachable Redis
the same readable way: a 503 page inside the admin's look (where Redis was looked for,
password hidden; what the page cannot do meanwhile; what to check; never a traceback),
or a ``CommandError`` naming the Redis, password hidden (``manage.py`` exits 1 on it).
One shared guard (relier_django/admin/pages.py) and one template behind every page.

The cases are listed by hand, and a test checks the lists against the admin's URLs and
the commands' parsers: a new page or (sub)command fails here until it has its case.
Each case waits for no retry budget (the ``redis_down`` fixture cuts it to nothing)."""

from __future__ import annotations

import argparse

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
from django.urls import reverse

PASSWORD = "hunter2"

PREFIX = "admin:relier_django_deadletter_"

PAGES = [
    pytest.param("changelist", (), None, id="dlq-list"),
    pytest.param("detail", ("some-entry",), None, id="dlq-entry"),
    pytest.param("actions", (), {"action": "release", "selected": "some-entry@1"}, id="dlq-action"),
    pytest.param("overview", (), None, id="overview"),
    pytest.param("task", ("some-task",), None, id="task"),
    pytest.param("scheduled", (), None, id="scheduled"),
    pytest.param("periodic", (), None, id="periodic"),
    pytest.param("limits", (), None, id="limits"),
    pytest.param("limit", (), None, id="limit-scope"),
]

COMMANDS = [
    pytest.param(("relier_dlq", "list"), id="relier_dlq-list"),
    pytest.param(("relier_dlq", "inspect", "some-entry"), id="relier_dlq-inspect"),
    pytest.param(("relier_dlq", "release", "some-entry"), id="relier_dlq-release"),
    pytest.param(("relier_dlq", "delete", "some-entry"), id="relier_dlq-delete"),
    pytest.param(("relier_dlq", "purge", "--yes"), id="relier_dlq-purge"),
    pytest.param(("relier_dlq", "export"), id="relier_dlq-export"),
    pytest.param(("relier_dlq", "stats"), id="relier_dlq-stats"),
    pytest.param(("relier_scheduled", "list"), id="relier_scheduled-list"),
    pytest.param(("relier_scheduled", "periodic"), id="relier_scheduled-periodic"),
    pytest.param(("relier_status",), id="relier_status"),
    pytest.param(("relier_resurrector", "--once"), id="relier_resurrector"),
    pytest.param(("relier_audit",), id="relier_audit"),
]


def _masked(url: str) -> str:
    return url.replace(f":{PASSWORD}@", ":***@")


@pytest.fixture
def redis_down(redis_down, monkeypatch, settings):  # type: ignore[no-untyped-def]
    """The shared fixture's unreachable Redis, with a password in its URL: every page
    and command must name where it looked without showing it."""
    from relier_django import conf

    url = redis_down.replace("redis://", f"redis://:{PASSWORD}@", 1)
    monkeypatch.setenv("RELIER_REDIS_URL", url)
    settings.RELIER = {**settings.RELIER, "REDIS_URL": url}
    conf.get_config.cache_clear()
    return url


def _admin_page_names() -> set[str]:
    from django.contrib import admin

    names = {
        pattern.name
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "relier_django"
        for pattern in model_admin.get_urls()
    }
    return {n.removeprefix(PREFIX.removeprefix("admin:")) for n in names if n}


def _command_cases() -> set[tuple[str, ...]]:
    """Each relier command, and each of its subcommands, as a case's first words."""
    cases: set[tuple[str, ...]] = set()
    for name, app in get_commands().items():
        if app != "relier_django":
            continue
        parser = load_command_class(app, name).create_parser("manage.py", name)
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        cases |= {(name, sub) for action in subs for sub in action.choices} or {(name,)}
    return cases


def test_the_cases_cover_every_admin_page_and_every_command_and_subcommand():
    assert {p.values[0] for p in PAGES} == _admin_page_names()
    expected = _command_cases()
    with_subcommands = {case[0] for case in expected if len(case) == 2}
    listed = {
        words[:2] if words[0] in with_subcommands else words[:1]
        for words in (p.values[0] for p in COMMANDS)
    }
    assert listed == expected


@pytest.mark.django_db
@pytest.mark.parametrize(("page", "args", "form"), PAGES)
def test_every_admin_page_answers_an_unreachable_redis_with_a_readable_503(
    client, django_user_model, redis_down, page, args, form
):
    # The permissions each page needs, no more: view (and manage for the actions).
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    codenames = ("view_dlq", "manage_dlq") if form is not None else ("view_dlq",)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="relier_django", codename__in=codenames
    ))  # fmt: skip
    client.force_login(user)
    url = reverse(PREFIX + page, args=args)
    response = client.post(url, form) if form is not None else client.get(url)
    text = response.content.decode()
    assert response.status_code == 503, text[:500]
    assert f"Relier cannot reach Redis at <code>{_masked(redis_down)}</code>" in text
    assert PASSWORD not in text
    assert "What to check" in text and 'id="redis-error"' in text and "ConnectionError" in text
    assert "Traceback" not in text and 'id="site-name"' in text  # inside the admin's look


@pytest.mark.django_db
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_an_unreachable_redis_with_a_command_error_naming_it(
    redis_down, command
):
    with pytest.raises(CommandError) as raised:
        call_command(*command)
    assert raised.value.returncode != 0  # manage.py exits with it
    assert "Redis" in str(raised.value) and _masked(redis_down) in str(raised.value)
    assert PASSWORD not in str(raised.value) and "Traceback" not in str(raised.value)
