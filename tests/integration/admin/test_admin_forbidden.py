"""Issue 27: staff refused by a Relier admin page get a 403 page in the admin's look
(docs/dlq-admin.md#permissions), not Django's bare "403 Forbidden": it names the
permission they lack, as code and as the Users and Groups pages list it, and says to
ask an administrator to grant it there. Every page needs ``relier_django.view_dlq``;
release and delete need ``relier_django.manage_dlq`` too. Django's test client
against the session's private Redis, which a refused request never reads."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from tests.dlq_entries import fail

pytestmark = pytest.mark.django_db

VIEW = "relier_django.view_dlq"
MANAGE = "relier_django.manage_dlq"
VIEW_LISTED = "Relier | dead-letter queue | Can view the dead-letter queue"
MANAGE_LISTED = "Relier | dead-letter queue | Can release and delete dead-letter entries"
ACTIONS = "admin:relier_django_deadletter_actions"


def page(name: str, *args: str) -> str:
    return reverse(f"admin:relier_django_deadletter_{name}", args=args)


@pytest.fixture
def login(client, django_user_model):
    """Log ``client`` in as staff named ``alice`` holding the given relier permissions."""

    def as_user(*codenames: str):
        user = django_user_model.objects.create_user("alice", password="pw", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="relier_django", codename=codename)
            )
        client.force_login(user)

    return as_user


def assert_forbidden_page(response, needs: list[str], listed: list[str]) -> str:
    """403 in the admin's look, naming exactly ``needs``; returns the page's text with
    its whitespace collapsed."""
    text = " ".join(response.content.decode().split())
    assert response.status_code == 403
    names = [t.name for t in response.templates]
    assert "relier_django/admin/forbidden.html" in names and "admin/base_site.html" in names
    assert '<div id="site-name">' in text  # the admin's header, not a bare page
    assert "<strong>alice</strong>" in text
    for permission in (VIEW, MANAGE):
        assert (f"<code>{permission}</code>" in text) == (permission in needs)
    for label in listed:
        assert f"listed as “{label}”" in text
    assert "Ask an administrator" in text and "<strong>Users</strong>" in text
    assert "<strong>Groups</strong>" in text
    return text


def test_every_relier_page_refuses_staff_without_view_dlq_by_naming_it(client, login, redis_client):
    env = fail()
    login()
    for url in (
        page("changelist"),
        page("detail", env.id),
        page("overview"),
        page("task", env.id),
        page("scheduled"),
        page("periodic"),
    ):
        text = assert_forbidden_page(client.get(url), [VIEW], [VIEW_LISTED])
        assert "This page needs a permission" in text, url


def test_the_manage_permission_alone_is_refused_by_naming_view_dlq(client, login, redis_client):
    login("manage_dlq")
    text = assert_forbidden_page(client.get(page("changelist")), [VIEW], [VIEW_LISTED])
    assert MANAGE_LISTED not in text


def test_release_and_delete_with_view_dlq_only_name_manage_dlq(client, login, redis_client):
    env = fail()
    login("view_dlq")
    for action in ("release", "delete"):
        for step in ({}, {"confirm": "yes"}):  # the confirm page and the act itself
            post = {"action": action, "selected": f"{env.id}@{env.fence}", **step}
            response = client.post(reverse(ACTIONS), post)
            text = assert_forbidden_page(response, [MANAGE], [MANAGE_LISTED])
            assert "Releasing and deleting dead-letter entries needs a permission" in text


def test_an_action_without_either_permission_names_both(client, login, redis_client):
    env = fail()
    login()
    post = {"action": "delete", "selected": f"{env.id}@{env.fence}", "confirm": "yes"}
    response = client.post(reverse(ACTIONS), post)
    text = assert_forbidden_page(response, [VIEW, MANAGE], [VIEW_LISTED, MANAGE_LISTED])
    assert "needs permissions that your account" in text
    assert client.get(page("detail", env.id)).status_code == 403  # and it is still there


def test_the_forbidden_page_is_never_cached_and_links_only_home(client, login, redis_client):
    login()
    response = client.get(page("changelist"))
    cache_control = response["Cache-Control"]
    assert "no-store" in cache_control and "max-age=0" in cache_control
    # Without view_dlq the Relier section is a 404: the breadcrumbs stop at Home.
    assert reverse("admin:app_list", args=["relier_django"]) not in response.content.decode()
