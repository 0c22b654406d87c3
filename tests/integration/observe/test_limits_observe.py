"""Seeing flow control (docs/flow-control.md, "Seeing it") with real workers on a real
Redis: while tasks are parked and after they drain, the reader (``readers.limits``),
the admin's Flow control pages (staff through Django's test client), ``relier_status``
and the Prometheus text must say what the store holds, and the counts and the wait
histogram must say what the scripts did.

The parked state is made by real pushes (sent at once: the test runs inside a
transaction) with no worker running (the push takes the
free slots and parks the rest, in push order); then a real worker drains it, each
freed slot handed over by commit.lua.
"""

from __future__ import annotations

import io
import json
import re
import time

import pytest
import redis
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from relier_django import metrics
from relier_django.readers import limits
from testproject.demo import limit_tasks
from testproject.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

RUN = "obs"
SHARED, SEQ = "n:shared", "t:demo.lim.sequence"
PREFIX = "admin:relier_django_deadletter_"


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def _scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    response = client.get("/relier/metrics")
    assert response.status_code == 200, response.content[:300]
    return _samples(response.content.decode())


def _status() -> str:
    out = io.StringIO()
    call_command("relier_status", stdout=out)
    return out.getvalue()


def _staff(client, django_user_model, *codenames: str):  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user(
        f"staff{django_user_model.objects.count()}", password="pw", is_staff=True
    )
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="relier_django", codename__in=codenames
    ))  # fmt: skip
    client.force_login(user)
    return user


def _park(redis_client: redis.Redis) -> dict[str, list[str]]:
    """With no worker: 'shared' (2 slots for every tenant) gets big0 (which runs 1.5 s
    once a worker starts) and big1 (slots), big2 and small0 (parked, one per tenant;
    small0's tenant ends like a slots hash's name, which the reader must not mistake
    for one); 'sequence' (1 slot per customer) gets x0 (its slot) and x1, x2 (parked
    under its one line)."""
    ids: dict[str, list[str]] = {"shared": [], "seq": []}
    for label, tenant in (
        ("big0", "big"),
        ("big1", "big"),
        ("big2", "big"),
        ("small0", "small:run"),
    ):
        sleep_s = 1.5 if label == "big0" else 0.05  # big0 holds its slot long enough to see
        ids["shared"].append(
            limit_tasks.shared.push_with(on_commit=False).push(RUN, tenant, label, sleep_s).task_id
        )
    for i in range(3):
        ids["seq"].append(
            limit_tasks.sequence.push_with(on_commit=False).push(RUN, "x", f"x{i}", 0.05).task_id
        )
    return ids


def test_parked_tasks_are_seen_everywhere_and_the_drain_is_measured(
    worker_factory, redis_client, client, django_user_model
):
    ids = _park(redis_client)
    pushed_ms = _redis_ms(redis_client)
    time.sleep(0.4)  # a wait the readings must see, on the Redis clock

    # -- the reader ---------------------------------------------------------------------
    found = limits.read()
    assert [s.scope for s in found.scopes] == [SHARED, f"{SEQ}|x"]
    shared, seq = found.scopes
    assert (shared.capacity, shared.in_use, shared.parked_total) == (2, 2, 2)
    assert sorted(h.task_id for h in shared.holders) == sorted(ids["shared"][:2])
    # Holding a slot, not running: scheduled for the leader's dispatch, no worker yet.
    assert {(h.state, h.worker, h.fence) for h in shared.holders} == {("scheduled", "", 1)}
    # One line per tenant, in turn order (the order their first task parked).
    assert [(p.key, p.parked, p.oldest_task_id) for p in shared.parked] == [
        ("big", 1, ids["shared"][2]),
        ("small:run", 1, ids["shared"][3]),
    ]
    elapsed_s = (found.at_ms - pushed_ms) / 1000
    assert 0.4 <= shared.oldest_wait_s <= elapsed_s + 1.0
    assert (seq.capacity, seq.in_use, seq.parked_total) == (1, 1, 2)
    assert [(p.key, p.parked, p.oldest_task_id) for p in seq.parked] == [("", 2, ids["seq"][1])]
    assert found.by_family() == {SHARED: (2, 2), SEQ: (1, 2)}

    # -- the admin ----------------------------------------------------------------------
    _staff(client, django_user_model)  # staff without the view permission: refused
    assert client.get(reverse(PREFIX + "limits")).status_code == 403
    _staff(client, django_user_model, "view_dlq")
    page = client.get(reverse(PREFIX + "limits")).content.decode()
    rows = re.findall(
        r'<tr class="limit-row">\s*<th class="field-scope"><a href="([^"]+)">([^<]+)</a></th>\s*'
        r'<td class="field-in-use">([^<]+)</td>\s*<td class="field-parked">(\d+)</td>',
        page,
    )
    assert [(scope, used, int(n)) for _, scope, used, n in rows] == [
        (SHARED, "2 of 2", 2),
        (f"{SEQ}|x", "1 of 1", 2),
    ]
    assert 'class="named-limit"><th scope="row">shared</th><td>2</td>' in page
    overview = client.get(reverse(PREFIX + "overview")).content.decode()
    assert f'href="{reverse(PREFIX + "limits")}" id="limits-link"' in overview
    assert re.search(r'id="limits-summary">3 slots held, 4 parked</a>', overview)
    scope_page = client.get(rows[0][0].replace("&amp;", "&")).content.decode()
    for task_id in ids["shared"][:2]:
        assert reverse(PREFIX + "task", args=[task_id]) in scope_page
    lines = re.findall(
        r'<tr class="line-row"><th class="field-key">([^<]+)</th>'
        r'<td class="field-parked">(\d+)</td><td><a href="[^"]+">([^<]+)</a></td>',
        scope_page,
    )
    assert lines == [("big", "1", ids["shared"][2]), ("small:run", "1", ids["shared"][3])]
    gone = client.get(reverse(PREFIX + "limit") + "?scope=n%3Anone")
    assert gone.status_code == 404

    # -- relier_status ------------------------------------------------------------------
    text = _status()
    assert "limits: 2 scope(s) in use, 3 slot(s) held, 4 parked" in text
    assert f"  {SHARED}: 2/2 held, 2 parked under 2 key(s), oldest waiting" in text
    assert f"  {SEQ}|x: 1/1 held, 2 parked under 1 key(s)" in text
    assert f"  {SHARED}: waited for a slot 2, for the rate 0; parked -> granted none yet" in text
    out = io.StringIO()
    call_command("relier_status", "--json", stdout=out)
    as_json = json.loads(out.getvalue())["limits"]
    assert [(s["scope"], s["in_use"], s["parked"]) for s in as_json["scopes"]] == [
        (SHARED, 2, 2),
        (f"{SEQ}|x", 1, 2),
    ]
    assert {"family": SHARED, "by": "slot", "count": 2} in as_json["throttled"]

    # -- Prometheus ---------------------------------------------------------------------
    samples = _scrape(client)
    assert samples[("relier_limit_slots_in_use", (("scope", SHARED),))] == 2
    assert samples[("relier_limit_parked", (("scope", SHARED),))] == 2
    assert samples[("relier_limit_slots_in_use", (("scope", SEQ),))] == 1  # keys summed
    assert samples[("relier_limit_parked", (("scope", SEQ),))] == 2
    throttled = "relier_tasks_throttled_total"
    assert samples[(throttled, (("by", "slot"), ("scope", SHARED)))] == 2
    assert samples[(throttled, (("by", "slot"), ("scope", SEQ)))] == 2
    assert not [k for k in samples if "|" in str(k)]  # never a series per key
    assert ("relier_limit_wait_seconds_count", (("scope", SHARED),)) not in samples

    # -- the drain ----------------------------------------------------------------------
    worker_factory(concurrency=4)

    def big0_running() -> limits.Holder | None:
        scope = limits.read().scope(SHARED)
        held = [h for h in scope.holders if h.task_id == ids["shared"][0]] if scope else []
        return held[0] if held and held[0].state == "running" else None

    running = wait_until(big0_running, 30, what="big0 running in its slot")
    assert "@" in running.worker and running.fence == 1  # the worker that holds it now
    wait_until(lambda: redis_client.llen(f"demo:lim:{RUN}") == 14, 60, what="every run recorded")
    wait_until(lambda: not limits.read().scopes, 30, what="every slot freed")
    samples = _scrape(client)
    # Every parked task was handed its slot once: big2 and small0, x1 and x2.
    assert samples[("relier_limit_wait_seconds_count", (("scope", SHARED),))] == 2
    assert samples[("relier_limit_wait_seconds_count", (("scope", SEQ),))] == 2
    assert samples[("relier_limit_wait_seconds_sum", (("scope", SHARED),))] >= 0.8  # 2 x 0.4
    assert samples[("relier_limit_slots_in_use", (("scope", SHARED),))] == 0
    assert samples[("relier_limit_parked", (("scope", SHARED),))] == 0
    assert samples[(throttled, (("by", "slot"), ("scope", SHARED)))] == 2  # no more waited
    text = _status()
    assert "limits: 0 scope(s) in use, 0 slot(s) held, 0 parked" in text
    assert f"  {SHARED}: waited for a slot 2, for the rate 0; parked -> granted 2 · p50" in text
    page = client.get(reverse(PREFIX + "limits")).content.decode()
    assert 'id="limits-empty"' in page
    figures = metrics.read()
    assert figures.limit_wait[SEQ].count == 2 and figures.throttled[(SEQ, "slot")] == 2


def test_a_rate_s_waits_are_counted_and_its_reservations_read(worker_factory, redis_client):
    """30 tasks of 20/s due at once, taken in one dispatch batch: the first 20 go (the
    burst), the other 10 each wait once for their reserved time."""
    receipts = [limit_tasks.rated.push_with(on_commit=False).push(RUN, f"r{i}") for i in range(30)]
    worker_factory(concurrency=4)
    seen = wait_until(
        lambda: (s := limits.read().scope("t:demo.lim.rated")) is not None and s,
        30,
        what="the rate's reservations",
    )
    assert seen.rate_reserved_until_ms is not None and seen.rate_next_free_ms is not None
    assert seen.rate_next_free_ms <= seen.rate_reserved_until_ms
    assert (seen.in_use, seen.parked_total) == (0, 0)  # a rate holds no slot
    for r in receipts:
        assert r.get(timeout=30)
    figures = metrics.read()
    assert figures.throttled == {("t:demo.lim.rated", "rate"): 10}
    assert "t:demo.lim.rated: waited for a slot 0, for the rate 10" in _status()
