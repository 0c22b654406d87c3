"""Every Relier admin page and every management command answers an unreachable Redis
the same readable way: a 503 page inside the admin's look (where Redis was looked for,
password hidden; what the page cannot do meanwhile; what to check; never a traceback),
or a ``CommandError`` naming the Redis. One shared guard (relier_django/admin/pages.py)
and one template behind every page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

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
    pytest.param(("relier_scheduled", "list"), id="relier_scheduled-list"),
    pytest.param(("relier_scheduled", "periodic"), id="relier_scheduled-periodic"),
    pytest.param(("relier_status",), id="relier_status"),
]


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
    assert f"Relier cannot reach Redis at <code>{redis_down}</code>" in text
    assert "What to check" in text and 'id="redis-error"' in text and "ConnectionError" in text
    assert "Traceback" not in text and 'id="site-name"' in text  # inside the admin's look


@pytest.mark.django_db
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_an_unreachable_redis_with_a_command_error_naming_it(
    redis_down, command
):
    with pytest.raises(CommandError) as raised:
        call_command(*command)
    assert redis_down in str(raised.value)
    assert "Traceback" not in str(raised.value)
