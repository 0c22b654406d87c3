"""The DLQ admin (docs/dlq-admin.md): every page needs the view permission, every change
the manage permission, a POST with CSRF and a confirmation; entry content is escaped;
Redis down is a readable 503. Django's test client against the session's private Redis;
entries are fabricated with the core's scripts, no worker needed."""

from __future__ import annotations

import html
import re

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from relier_django import dlq as dlq_api
from relier_django.core.broker import publish
from relier_django.core.model.failure import Reason
from testproject.demo import tasks
from tests.dlq_entries import fail, traceback_of, untied

pytestmark = pytest.mark.django_db

LIST = "admin:relier_django_deadletter_changelist"
ACTIONS = "admin:relier_django_deadletter_actions"
XSS = "<script>alert(1)</script>"


def detail_url(entry_id: str) -> str:
    return reverse("admin:relier_django_deadletter_detail", args=[entry_id])


def pin(env) -> str:
    return f"{env.id}@{env.fence}"


@pytest.fixture
def store(redis_client):
    return dlq_api.store()


@pytest.fixture
def login(client, django_user_model):
    """Log ``client`` in as a staff user holding the given relier_django permissions."""

    def as_user(*codenames: str, on: Client | None = None):
        user = django_user_model.objects.create_user(
            f"staff{django_user_model.objects.count()}", password="pw", is_staff=True
        )
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="relier_django", codename=codename)
            )
        (on or client).force_login(user)
        return user

    return as_user


def rows(response) -> int:
    return response.content.decode().count('<th class="field-id">')


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_migrate_makes_the_two_permissions_and_no_table_for_the_dlq():
    perms = Permission.objects.filter(content_type__app_label="relier_django")
    assert sorted(perms.values_list("codename", flat=True)) == ["manage_dlq", "view_dlq"]
    # The DLQ lives in Redis; the only tables are the outbox's and the inbox's
    # (docs/transactions.md), which have no admin and no permissions.
    tables = [t for t in connection.introspection.table_names() if t.startswith("relier")]
    assert sorted(tables) == ["relier_inbox", "relier_outbox"]
    call_command("makemigrations", "relier_django", "--check", "--dry-run", verbosity=0)


def test_an_anonymous_visitor_is_sent_to_the_login_page(client, store):
    env = fail()
    for url in (reverse(LIST), detail_url(env.id)):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert (
        client.post(reverse(ACTIONS), {"action": "delete", "selected": pin(env)}).status_code == 302
    )
    assert store.get(env.id) is not None


def test_staff_without_the_view_permission_get_403_and_no_relier_section(client, login, store):
    env = fail()
    login()
    assert client.get(reverse(LIST)).status_code == 403
    assert client.get(detail_url(env.id)).status_code == 403
    post = {"action": "delete", "selected": pin(env), "confirm": "yes"}
    assert client.post(reverse(ACTIONS), post).status_code == 403
    index = client.get(reverse("admin:index")).content.decode()
    assert reverse(LIST) not in index and "Dead-letter queue" not in index
    assert store.get(env.id) is not None


def test_the_manage_permission_alone_opens_nothing(client, login, store):
    env = fail()
    login("manage_dlq")
    assert client.get(reverse(LIST)).status_code == 403
    post = {"action": "delete", "selected": pin(env), "confirm": "yes"}
    assert client.post(reverse(ACTIONS), post).status_code == 403
    assert store.get(env.id) is not None


def test_the_view_permission_shows_list_and_detail_without_buttons_and_no_change(
    client, login, store
):
    env = fail(tasks.record, "seen", message="it broke")
    login("view_dlq")
    index = client.get(reverse("admin:index")).content.decode()
    assert "Relier" in index and f'href="{reverse(LIST)}"' in index
    listing = client.get(reverse(LIST))
    assert listing.status_code == 200 and rows(listing) == 1
    page = listing.content.decode()
    assert env.id in page and "ValueError: it broke" in page
    assert 'name="selected"' not in page and reverse(ACTIONS) not in page
    entry = client.get(detail_url(env.id))
    text = entry.content.decode()
    assert entry.status_code == 200
    assert f'<pre class="traceback">{traceback_of("it broke")}</pre>' in text
    assert html.escape('"args": [\n    "seen"\n  ]') in text  # the envelope, indented
    assert "Release…" not in text and reverse(ACTIONS) not in text
    for step in ({}, {"confirm": "yes"}):
        post = {"action": "release", "selected": pin(env), **step}
        assert client.post(reverse(ACTIONS), post).status_code == 403
    assert store.get(env.id) is not None


def test_release_shows_a_confirm_page_then_releases_the_failure_shown(
    client, login, store, redis_client
):
    env = fail(tasks.record, "again")
    queue = store.get(env.id).summary.queue or "celery"
    login("view_dlq", "manage_dlq")
    detail = client.get(detail_url(env.id)).content.decode()
    assert "Release…" in detail and f'value="{pin(env)}"' in detail
    confirm = client.post(reverse(ACTIONS), {"action": "release", "selected": pin(env)})
    assert confirm.status_code == 200 and "Will be released." in confirm.content.decode()
    assert store.size() == 1 and redis_client.llen(queue) == 0  # nothing happened yet
    done = client.post(
        reverse(ACTIONS), {"action": "release", "selected": pin(env), "confirm": "yes"}
    )
    assert done.status_code == 302 and done["Location"] == reverse(LIST)
    assert store.get(env.id) is None and store.size() == 0
    (message,) = redis_client.lrange(queue, 0, -1)  # sent to the broker; no worker running
    assert env.id.encode() in message
    follow = client.get(done["Location"])
    assert any(m.startswith(f"Released 1 entry: {env.id}") for m in messages_of(follow))


def test_a_broker_that_refuses_a_release_is_a_message_and_the_entry_stays(
    client, login, store, monkeypatch
):
    from kombu.exceptions import OperationalError

    env = fail(tasks.record, "broker-down")
    before = store.get(env.id)

    def refuse(*args, **kwargs):
        raise OperationalError("Error 111 connecting to the broker")

    monkeypatch.setattr(publish, "send", refuse)
    login("view_dlq", "manage_dlq")
    done = client.post(
        reverse(ACTIONS), {"action": "release", "selected": pin(env), "confirm": "yes"}
    )
    assert done.status_code == 302
    (message,) = messages_of(client.get(done["Location"]))
    assert message.startswith("The Celery broker cannot be reached")
    assert store.get(env.id) == before and store.size() == 1


def test_delete_shows_a_confirm_page_then_deletes(client, login, store):
    env, keep = fail(tasks.record, "del"), fail(tasks.record, "keep")
    login("view_dlq", "manage_dlq")
    confirm = client.post(reverse(ACTIONS), {"action": "delete", "selected": pin(env)})
    assert "Will be deleted." in confirm.content.decode() and store.size() == 2
    done = client.post(
        reverse(ACTIONS), {"action": "delete", "selected": pin(env), "confirm": "yes"}
    )
    assert done.status_code == 302
    assert store.get(env.id) is None and store.get(keep.id) is not None
    assert messages_of(client.get(reverse(LIST))) == [f"Deleted 1 entry: {env.id}."]


def test_bulk_release_and_delete_act_on_exactly_the_three_selected(
    client, login, store, redis_client
):
    envs = [fail(tasks.record, f"bulk{i}") for i in range(8)]
    login("view_dlq", "manage_dlq")
    listing = client.get(reverse(LIST)).content.decode()
    assert listing.count('name="selected"') == 8
    to_release, to_delete, untouched = envs[:3], envs[3:6], envs[6:]
    for action, chosen in (("release", to_release), ("delete", to_delete)):
        selected = [pin(e) for e in chosen]
        confirm = client.post(reverse(ACTIONS), {"action": action, "selected": selected})
        assert confirm.content.decode().count(f"Will be {action}d.") == 3
        post = {"action": action, "selected": selected, "confirm": "yes"}
        (message,) = messages_of(client.post(reverse(ACTIONS), post, follow=True))
        assert message.startswith(f"{action.capitalize()}d 3 entries: ")
        assert all(e.id in message for e in chosen)
    assert {s.id for s in store.page().entries} == {e.id for e in untouched}
    assert redis_client.llen("celery") == 3  # one message per released entry


def test_refusals_are_error_messages_and_a_stale_pin_changes_nothing(client, login, store):
    env, raw_id = fail(tasks.record, "stale"), untied("<not json>")
    login("view_dlq", "manage_dlq")
    stale = f"{env.id}@{env.fence + 1}"  # a failure other than the one the entry holds
    confirm = client.post(
        reverse(ACTIONS), {"action": "release", "selected": [stale, f"{raw_id}@"]}
    )
    assert "Failed again since" in confirm.content.decode()
    assert "Holds no envelope" in confirm.content.decode()
    post = {"action": "release", "selected": [stale, f"{raw_id}@"], "confirm": "yes"}
    follow = client.post(reverse(ACTIONS), post, follow=True)
    errors = messages_of(follow)
    assert len(errors) == 2 and all(m.startswith("Not released: DLQ entry") for m in errors)
    assert "holding the failure at fence 2" in errors[0] and "no envelope" in errors[1]
    post = {"action": "delete", "selected": stale, "confirm": "yes"}
    follow = client.post(reverse(ACTIONS), post, follow=True)
    assert messages_of(follow) == [f"Not deleted, already gone or failed again since: {env.id}."]
    assert store.size() == 2


def test_an_entry_id_with_url_characters_opens_and_releases(client, login, store):
    env = fail(tasks.record, "odd", task_id="tenant/7@acme?x=1#%2F")
    login("view_dlq", "manage_dlq")
    assert html.escape(detail_url(env.id)) in client.get(reverse(LIST)).content.decode()
    assert client.get(detail_url(env.id)).context["summary"].id == env.id
    post = {"action": "release", "selected": pin(env), "confirm": "yes"}
    assert client.post(reverse(ACTIONS), post).status_code == 302
    assert store.size() == 0


def test_an_entry_whose_id_holds_a_newline_from_before_ids_were_checked_is_listed_and_opens(
    client, login, store
):
    # push() refuses such an id now (model.ids); one stored before that must still be
    # reachable, so an operator can read it and act on it, not meet an HTTP 500.
    env = fail(tasks.record, "legacy", raw_id="order-1\nforged")
    login("view_dlq", "manage_dlq")
    listing = client.get(reverse(LIST))
    assert listing.status_code == 200
    assert html.escape(detail_url(env.id)) in listing.content.decode()
    assert "/entry/order-1%0Aforged/" in detail_url(env.id)
    detail = client.get(detail_url(env.id))
    assert detail.status_code == 200 and detail.context["summary"].id == env.id
    confirm = client.post(reverse(ACTIONS), {"action": "delete", "selected": pin(env)})
    assert confirm.status_code == 200 and "Will be deleted." in confirm.content.decode()
    post = {"action": "delete", "selected": pin(env), "confirm": "yes"}
    assert client.post(reverse(ACTIONS), post).status_code == 302
    assert store.size() == 0


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(login, store):
    env = fail()
    strict = Client(enforce_csrf_checks=True)
    login("view_dlq", "manage_dlq", on=strict)
    for action in ("release", "delete"):
        post = {"action": action, "selected": pin(env), "confirm": "yes"}
        assert strict.post(reverse(ACTIONS), post).status_code == 403
    assert store.get(env.id) is not None
    # The same client with the token from the confirm form goes through.
    assert strict.get(detail_url(env.id)).status_code == 200
    token = strict.cookies[settings.CSRF_COOKIE_NAME].value
    post = {
        "action": "delete",
        "selected": pin(env),
        "confirm": "yes",
        "csrfmiddlewaretoken": token,
    }
    assert strict.post(reverse(ACTIONS), post).status_code == 302
    assert store.get(env.id) is None


def test_a_get_on_the_action_url_is_405_and_pages_are_never_cached(client, login, store):
    env = fail()
    login("view_dlq", "manage_dlq")
    url = reverse(ACTIONS) + f"?action=delete&selected={pin(env)}&confirm=yes"
    assert client.get(url).status_code == 405
    assert store.get(env.id) is not None
    for page in (reverse(LIST), detail_url(env.id)):
        cache_control = client.get(page)["Cache-Control"]
        assert "no-store" in cache_control and "max-age=0" in cache_control


def test_pagination_visits_each_of_120_entries_once_50_a_page(client, login, store):
    made = {fail(tasks.record, f"p{i}").id for i in range(120)}
    login("view_dlq")
    seen: list[str] = []
    sizes: list[int] = []
    url = reverse(LIST)
    while True:
        page = client.get(url).content.decode()
        ids = re.findall(r'<th class="field-id"><a href="[^"]+">([^<]+)</a>', page)
        seen += ids
        sizes.append(len(ids))
        if len(sizes) > 1:
            assert 'id="dlq-first-page"' in page
        found = re.search(r'<a href="([^"]+)" id="dlq-next-page">', page)
        if found is None:
            break
        url = reverse(LIST) + html.unescape(found.group(1))
    assert sizes == [50, 50, 20]
    assert len(seen) == 120 and set(seen) == made


def test_filters_by_task_and_reason_with_their_counts(client, login, store):
    for i in range(3):
        fail(tasks.record, f"r{i}")
    for i in range(2):
        fail(tasks.sync_record, f"s{i}", reason=Reason.RETRIES_EXHAUSTED)
    fail(tasks.record, "t", reason=Reason.HARD_TIMEOUT)
    untied()
    login("view_dlq")
    everything = client.get(reverse(LIST))
    page = everything.content.decode()
    assert rows(everything) == 7 and "7 in the dead-letter queue" in page
    assert "demo.record (4)" in page and "demo.sync_record (2)" in page
    assert "(no task name) (1)" in page
    assert "exception (3)" in page and "retries_exhausted (2)" in page
    by_task = client.get(reverse(LIST), {"task": "demo.record"})
    page = by_task.content.decode()
    assert rows(by_task) == 4 and "4 matching, 7 in the dead-letter queue" in page
    # Within the task, reasons are counted for that task only.
    assert "exception (3)" in page and "hard_timeout (1)" in page
    assert "retries_exhausted" not in page
    both = client.get(reverse(LIST), {"task": "demo.record", "reason": "hard_timeout"})
    assert rows(both) == 1 and "1 matching" in both.content.decode()
    by_reason = client.get(reverse(LIST), {"reason": "retries_exhausted"})
    assert rows(by_reason) == 2 and "demo.sync_record (2)" in by_reason.content.decode()
    no_task = client.get(reverse(LIST), {"task": ""})  # messages never tied to a task
    assert rows(no_task) == 1 and "malformed_message (1)" in no_task.content.decode()


def test_search_by_exact_id_opens_the_entry_and_text_finds_task_names(client, login, store):
    env = fail(tasks.record, "find")
    fail(tasks.sync_record, "other")
    login("view_dlq")
    assert client.get(reverse(LIST), {"q": env.id})["Location"] == detail_url(env.id)
    one = client.get(reverse(LIST), {"q": "SYNC_rec"})
    assert one["Location"] == reverse(LIST) + "?task=demo.sync_record&q=SYNC_rec"
    several = client.get(reverse(LIST), {"q": "record"}).content.decode()
    assert "2 task names contain" in several and "?task=demo.record" in several
    none = client.get(reverse(LIST), {"q": "nothing-like-it"}).content.decode()
    assert "No entry has the id “nothing-like-it”" in none


def search_box(page: str) -> str:
    found = re.search(r'<input type="text" size="40" name="q" value="([^"]*)" id="searchbar"', page)
    assert found is not None, "no search box"
    return html.unescape(found.group(1))


def test_the_search_box_keeps_the_query_after_each_kind_of_search(client, login, store):
    fail(tasks.record, "find")
    fail(tasks.sync_record, "other", reason=Reason.RETRIES_EXHAUSTED)
    login("view_dlq", "manage_dlq")
    one = client.get(reverse(LIST), {"q": "SYNC_rec"}, follow=True)  # one task: filtered
    page = one.content.decode()
    assert search_box(page) == "SYNC_rec" and rows(one) == 1 and "demo.sync_record" in page
    assert "No entry has the id" not in page and 'id="task-matches"' not in page
    # A reason within the task and the way back after an action keep it too.
    assert html.escape("?task=demo.sync_record&reason=retries_exhausted&q=SYNC_rec") in page
    assert '<input type="hidden" name="q" value="SYNC_rec">' in page
    several = client.get(reverse(LIST), {"q": "record"}).content.decode()
    assert search_box(several) == "record" and "2 task names contain" in several
    quoted = client.get(reverse(LIST), {"q": '<"nothing">'}).content.decode()
    assert search_box(quoted) == '<"nothing">' and "No entry has the id" in quoted


def test_entry_content_is_escaped_on_the_list_the_detail_and_the_confirm_page(client, login, store):
    env = fail(tasks.record, XSS, message=XSS)
    login("view_dlq", "manage_dlq")
    pages = {
        "list": client.get(reverse(LIST)),
        "detail": client.get(detail_url(env.id)),
        "confirm": client.post(reverse(ACTIONS), {"action": "delete", "selected": pin(env)}),
    }
    for name, response in pages.items():
        text = response.content.decode()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, name
        assert "<script>alert(1)" not in text, name


def test_an_unknown_entry_leads_back_to_the_list_with_a_message(client, login, store):
    login("view_dlq")
    response = client.get(detail_url("no-such-entry"), follow=True)
    assert response.redirect_chain == [(reverse(LIST), 302)]
    assert "There is no entry no-such-entry" in messages_of(response)[0]
