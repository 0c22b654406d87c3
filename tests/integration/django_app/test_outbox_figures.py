"""The outbox's backlog where an operator looks (docs/observability.md): the
``relier_outbox_backlog`` gauge, one series per database that has the outbox table,
and one line per database on the admin's overview. Rows written by the real hook, in
a real transaction, on SQLite and the session's PostgreSQL."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import transaction
from django.urls import reverse

from relier_django import metrics
from relier_django.models import OutboxEntry
from testproject.demo import tasks
from tests.databases import DATABASES, HAVE_PG


@pytest.fixture
def outbox_on(settings, monkeypatch):
    monkeypatch.delenv("RELIER_OUTBOX", raising=False)
    settings.RELIER = {**settings.RELIER, "OUTBOX": True}


def _hold_rows(alias: str, n: int) -> None:
    """n committed outbox rows on ``alias`` whose sends never happen (the process
    "died" before its on_commit callbacks: they are dropped here)."""
    with transaction.atomic(using=alias):
        for i in range(n):
            tasks.record.push_with(using=alias).push(f"held-{alias}-{i}")
        transaction.get_connection(alias).run_on_commit.clear()


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_the_backlog_gauge_counts_each_databases_waiting_rows(outbox_on, redis_client):
    _hold_rows("default", 2)
    if HAVE_PG:
        _hold_rows("pg", 3)
    backlog = metrics.outbox_backlog()
    assert backlog["default"] == 2 == OutboxEntry.objects.using("default").count()
    text = metrics.exposition(metrics.read(), backlog).decode()
    assert 'relier_outbox_backlog{database="default"} 2.0' in text
    if HAVE_PG:
        assert backlog["pg"] == 3
        assert 'relier_outbox_backlog{database="pg"} 3.0' in text
    assert redis_client.dbsize() == 0  # nothing was sent: the rows are all there is


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_the_overview_shows_the_outbox_backlog(outbox_on, redis_client, client, django_user_model):
    _hold_rows("default", 1)
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="relier_django", codename="view_dlq")
    )
    client.force_login(user)
    page = client.get(reverse("admin:relier_django_deadletter_overview")).content.decode()
    assert "default: committed pushes the relay has yet to send" in page
    assert '<td class="outbox-backlog">1 row</td>' in page
