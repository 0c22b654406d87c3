"""G5: the DLQ store. dead_letter.lua, dlq_delete.lua and the release scripts keep the
indexes and counts in step; cursor pages are exact under any filter; nothing leaves the
DLQ except by release, delete or purge. Against the session's private Redis."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from relier_django.core.broker import publish
from relier_django.core.dlq import dead_letter as dlq
from relier_django.core.dlq import release
from relier_django.core.dlq.store import Cursor, DeadLetterStore, Query, lex_member
from relier_django.core.model import config
from relier_django.core.model.envelope import decode
from relier_django.core.model.errors import DuplicateTaskId, EntryNotReleasable
from relier_django.core.model.failure import Failure, Reason
from relier_django.core.model.transition import history_tail
from relier_django.core.push import producer
from relier_django.core.store import scripts
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from tests.dlq_entries import fail, traceback_of, untied

KEYS = KeySpace("rl")


@pytest.fixture
def store(redis_client) -> DeadLetterStore:
    return DeadLetterStore(sync_client(config.current()), KEYS)


def everything(store: DeadLetterStore, query: Query | None = None, limit: int = 7) -> list[str]:
    ids, cursor = [], None
    while True:
        page = store.page(query or Query(), cursor, limit)
        ids += [s.id for s in page.entries]
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


def newest_first(store: DeadLetterStore, ids: list[str]) -> list[str]:
    """The listing order: newest failure first, the same millisecond in id order."""
    return sorted(ids, key=lambda i: (-store.get(i).summary.failed_at_ms, i))


def test_an_entry_is_indexed_counted_and_summarised_when_it_lands(store):
    env = fail(tasks.record, "a1", message="first line\n   second line")
    (summary,) = store.page().entries
    assert summary.id == env.id and summary.task == tasks.record.name
    assert summary.reason == "exception" and summary.error == "ValueError: first line second line"
    assert summary.fence == 1 and summary.failures == 1
    assert summary.first_failed_at_ms == summary.failed_at_ms
    counts = store.counts()
    assert counts.total == 1 == store.size()
    assert counts.by_task == {tasks.record.name: 1} and counts.by_reason == {"exception": 1}
    assert counts.by_reason_and_task == {("exception", tasks.record.name): 1}
    entry = store.get(env.id)
    assert entry.envelope["args"] == ["a1"] and entry.data["traceback"] == traceback_of(
        "first line\n   second line"
    )
    assert [h["event"] for h in entry.history] == ["dead"]
    assert entry.to_json()["failed_at"].endswith("Z")
    assert store.span() == (summary.failed_at_ms, summary.failed_at_ms)


def test_the_lex_index_holds_exactly_the_members_dlq_store_builds_and_parses(store, redis_client):
    """G5: _dlq_index.lua writes the lex index; dlq_store.py builds its members (the
    bounds of every page) and parses them (cursors, ids), each side on its own. A change
    to either layout alone fails here."""
    tied = fail(tasks.record, "x1", reason=Reason.RETRIES_EXHAUSTED).id
    raw = untied(task="")  # no task name: an empty field between separators
    built: dict[bytes, Cursor] = {}  # member -> the entry it names
    for entry_id in (tied, raw):
        summary = store.get(entry_id).summary
        at_ms, task, reason = summary.failed_at_ms, summary.task or "", summary.reason
        for q in (Query(), Query(task), Query(reason=reason), Query(task, reason)):
            built[lex_member(q, at_ms, entry_id)] = Cursor(at_ms, entry_id)
            assert entry_id in [s.id for s in store.page(q).entries]
    written = redis_client.zrange(KEYS.dlq_lex, 0, -1)  # bytes, as the script wrote them
    assert {m: Cursor.after(m.decode()) for m in written} == built
    assert len(written) == len(built) == 8


def test_an_empty_dlq_has_no_span_and_no_counts(store):
    assert store.span() is None and store.counts().total == 0 and store.page().entries == ()


def test_cursor_pages_are_exact_newest_first_under_every_filter(store):
    made: list[tuple[str, str, str]] = []  # (id, task, reason), oldest first
    for i in range(60):
        task = (tasks.record, tasks.sync_record, tasks.explode)[i % 3]
        reason = (Reason.EXCEPTION, Reason.RETRIES_EXHAUSTED)[i % 2]
        made.append((fail(task, f"p{i}", reason=reason).id, task.name, str(reason)))
    # Newest first; failures within the same millisecond in id order.
    at = {m[0]: store.get(m[0]).summary.failed_at_ms for m in made}
    newest_first = sorted(made, key=lambda m: (-at[m[0]], m[0]))
    assert everything(store) == [m[0] for m in newest_first]
    for query in (
        Query(task=tasks.sync_record.name),
        Query(reason="retries_exhausted"),
        Query(task=tasks.explode.name, reason="exception"),
    ):
        want = [
            m[0]
            for m in newest_first
            if query.task in (None, m[1]) and query.reason in (None, m[2])
        ]
        assert everything(store, query, limit=4) == want
        assert store.counts().matching(query) == len(want)
    # A single page of exactly the remaining size says there is no next page.
    assert store.page(Query(), None, 60).next_cursor is None


def test_since_keeps_only_failures_at_or_after_the_bound(store):
    old = [fail(tasks.record, f"o{i}").id for i in range(3)]
    time.sleep(0.05)
    bound = store.server_time_ms()
    time.sleep(0.05)
    new = [fail(tasks.record, f"n{i}").id for i in range(4)]
    assert everything(store, Query(since_ms=bound), limit=3) == newest_first(store, new)
    assert set(everything(store)) == set(old + new)


def test_a_cursor_stays_valid_after_its_entry_is_deleted(store):
    ids = [fail(tasks.record, f"c{i}").id for i in range(10)]
    order = newest_first(store, ids)
    first = store.page(Query(), None, 4)
    assert store.delete([first.entries[-1].id]) == [first.entries[-1].id]
    rest: list[str] = []
    cursor = first.next_cursor
    while cursor is not None:
        page = store.page(Query(), cursor, 4)
        rest += [s.id for s in page.entries]
        cursor = page.next_cursor
    assert rest == order[4:]


def test_a_bad_cursor_or_limit_is_a_clear_error(store):
    with pytest.raises(ValueError, match="not a DLQ cursor"):
        Cursor.parse("yesterday")
    with pytest.raises(ValueError, match="between 1 and"):
        store.page(Query(), None, 0)


def test_delete_removes_the_entry_from_every_index_and_count(store):
    keep = fail(tasks.record, "k")
    gone = fail(tasks.sync_record, "g", reason=Reason.HARD_TIMEOUT)
    assert store.delete([gone.id, "no-such-id", gone.id]) == [gone.id]
    assert store.get(gone.id) is None
    assert everything(store) == [keep.id]
    counts = store.counts()
    assert counts.total == 1 and counts.by_task == {tasks.record.name: 1}
    assert counts.by_reason == {"exception": 1}
    assert everything(store, Query(reason="hard_timeout")) == []
    client = sync_client(config.current())
    assert client.zcard(KEYS.dlq_lex) == 4  # one entry: four lex members, nothing stale


def test_a_delete_pinned_to_an_older_failure_leaves_the_newer_one(store):
    env = fail(tasks.record, "pinned")
    assert store.delete([env.id], [env.fence + 1]) == []
    assert store.delete([env.id], [env.fence]) == [env.id]


def test_purge_deletes_only_entries_that_failed_before_the_cutoff(store):
    old = [fail(tasks.record, f"old{i}").id for i in range(5)]
    time.sleep(0.05)
    cutoff = store.server_time_ms()
    time.sleep(0.05)
    new = [fail(tasks.record, f"new{i}").id for i in range(3)]
    assert store.count_failed_before(cutoff) == len(old)
    assert store.purge(cutoff, batch=2) == len(old)
    assert set(everything(store)) == set(new)
    assert store.purge() == 3 and store.size() == 0 and store.counts().by_task == {}


def test_a_purge_goes_on_past_a_batch_that_was_released_under_it(store, monkeypatch):
    # The whole first batch is released between the purge reading it and deleting it;
    # the entries after it failed before the cutoff all the same and must go.
    ids = [fail(tasks.record, f"p{i}").id for i in range(6)]
    read = store.client.zrangebyscore
    first = []

    def then_released(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = read(*args, **kwargs)
        if not first:
            first.extend(found)
            for entry_id in found:
                release.release(app, config.current(), entry_id)
        return found

    monkeypatch.setattr(store.client, "zrangebyscore", then_released)
    assert store.purge(batch=2) == 4
    assert len(first) == 2 and store.size() == 0
    for entry_id in first:  # released: live again, not deleted
        assert store.client.hget(KEYS.task(entry_id), "state") == "queued"
    for entry_id in set(ids) - set(first):
        assert not store.client.exists(KEYS.task(entry_id))


def test_a_purge_racing_releases_deletes_or_releases_each_entry_never_both(store):
    ids = [fail(tasks.record, f"r{i}").id for i in range(200)]
    to_release = ids[::-1]  # from the far end of the purge's order: the two meet
    released, refused = [], []
    under_way = threading.Event()

    def releaser() -> None:
        for entry_id in to_release:
            try:
                released.append(release.release(app, config.current(), entry_id).task_id)
            except EntryNotReleasable:
                refused.append(entry_id)  # the purge took it first
            under_way.set()

    thread = threading.Thread(target=releaser)
    thread.start()
    under_way.wait(10)
    purged = store.purge(batch=1)
    thread.join()

    assert released and refused, "the purge and the releases did not overlap"
    assert len(released) + len(refused) == len(ids)
    assert purged + len(released) == len(ids)  # each entry went one way, exactly
    assert store.size() == 0 and store.counts().total == 0
    for entry_id in released:  # live again; its entry gone with the release
        assert store.client.hget(KEYS.task(entry_id), "state") == "queued"
        assert not store.client.exists(KEYS.dlq_entry(entry_id))
    for entry_id in refused:  # purged: nothing of it left
        assert not store.client.exists(KEYS.task(entry_id))
        assert not store.client.exists(KEYS.dlq_entry(entry_id))


def test_a_message_that_is_no_envelope_keeps_its_raw_body_queue_and_addressee(store):
    untied(task="demo.record", raw="<not json>", queue="critical")
    (summary,) = store.page(Query(reason="malformed_message")).entries
    assert summary.task == "demo.record" and summary.queue == "critical"
    assert summary.fence is None
    entry = store.get(summary.id)
    assert entry.raw == "<not json>" and entry.envelope is None
    with pytest.raises(EntryNotReleasable, match="no envelope"):
        release.release(app, config.current(), summary.id)


def test_a_push_cannot_reuse_the_id_of_an_entry_in_the_dlq(store):
    env = fail(tasks.record, "taken")
    with pytest.raises(DuplicateTaskId, match="dead-letter queue; release it"):
        producer.push(tasks.record.relier_spec, app, ("again",), {}, task_id=env.id)


def test_release_leaves_the_indexes_and_a_second_failure_keeps_the_first_time(store):
    env = fail(tasks.record, "twice")
    first = store.get(env.id).summary
    receipt = release.release(app, config.current(), env.id, expected_fence=first.fence)
    assert store.size() == 0 and store.counts().by_task == {} and store.get(env.id) is None
    # The released incarnation fails again: the same entry id, counted twice now.
    client = sync_client(config.current())
    fresh = decode(client.hget(KEYS.task(receipt.task_id), "env"))
    failure = Failure(Reason.EXCEPTION, "ValueError", "again", worker="w:2")
    time.sleep(0.01)
    assert dlq.dead_letter(KEYS, failure, 60_000, env=fresh, held="queued").run(client).accepted
    second = store.get(env.id).summary
    assert second.failures == 2 and second.fence == first.fence + 1
    assert second.first_failed_at_ms == first.failed_at_ms < second.failed_at_ms
    assert store.counts().total == 1 and everything(store) == [env.id]
    events = [h["event"] for h in store.get(env.id).history]
    assert events == ["dead", "released", "dead"]


def test_a_refused_dispatch_puts_the_entry_back_in_every_index(store, monkeypatch):
    env = fail(tasks.sync_record, "refused", reason=Reason.RETRIES_EXHAUSTED)
    before = store.counts()

    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(publish, "send", refuse)
    with pytest.raises(ConnectionError):
        release.release(app, config.current(), env.id)
    assert store.counts() == before
    assert everything(store, Query(task=tasks.sync_record.name, reason="retries_exhausted")) == [
        env.id
    ]


def test_a_failure_during_a_release_is_not_erased_when_the_release_completes(store):
    """The race release_done.lua guards: the released task fails again before the
    releasing side marks its release done. The new failure must stay."""
    env = fail(tasks.record, "fast-fail")
    client = sync_client(config.current())
    # release.lua, then a dead-letter of the new incarnation, then release_done.lua.
    nxt = dataclasses.replace(env, fence=2)
    tail = history_tail("released", fence=2)
    code = scripts.ScriptCall(
        scripts.RELEASE,
        KEYS.for_release(env.id, env.id, None),
        [env.id, env.id, nxt.encode(), 2, env.task, env.queue, 3, 60_000, tail, 1, "release-1"],
        int,
    ).run(client)
    assert code == 1
    failure = Failure(Reason.EXCEPTION, "ValueError", "again")
    assert dlq.dead_letter(KEYS, failure, 60_000, env=nxt, held="queued").run(client).accepted
    done = scripts.ScriptCall(scripts.RELEASE_DONE, KEYS.for_release_done(env.id), [2], int).run(
        client
    )
    assert done == 0
    assert store.get(env.id).fence == 2 and everything(store) == [env.id]


def test_a_release_built_from_a_stale_read_is_refused_not_given_a_reused_fence(store, monkeypatch):
    """release() reads the entry, then runs release.lua: if the task failed again in
    between, the new incarnation's fence (derived from the read) would not be above the
    newer failure's. The script must refuse it, even without an expected fence."""
    env = fail(tasks.record, "stale-read")
    stale = store.get(env.id)
    client = sync_client(config.current())
    client.hset(KEYS.dlq_entry(env.id), "fence", env.fence + 1)  # a later failure landed
    monkeypatch.setattr(DeadLetterStore, "get", lambda self, entry_id: stale)
    with pytest.raises(EntryNotReleasable, match="holding the failure at fence 1"):
        release.release(app, config.current(), env.id)
    assert store.size() == 1 and not client.exists(KEYS.task(env.id))


def test_deleting_or_purging_an_entry_removes_its_checkpoint_files(redis_client, tmp_path):
    from relier_django.core.model.config import Config
    from relier_django.core.store import checkpoint

    files = Config(checkpoint_dir=str(tmp_path), checkpoint_max_bytes=1)
    envs = [fail(tasks.record, f"files{i}") for i in range(3)]
    for env in envs:  # a large checkpoint each, as a task with CHECKPOINT_DIR writes it
        checkpoint.record(files, env.id, env.fence, {"rows": list(range(10))})
    store = DeadLetterStore(sync_client(config.current()), KEYS, str(tmp_path))
    assert len(list(tmp_path.rglob("*.json"))) == 3
    assert store.delete([envs[0].id]) == [envs[0].id]
    assert len(list(tmp_path.rglob("*.json"))) == 2
    assert store.purge() == 2
    assert list(tmp_path.rglob("*.json")) == []
