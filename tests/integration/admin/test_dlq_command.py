"""G5 for operators: ``manage.py relier_dlq`` lists, inspects, releases, deletes, purges
and exports what the DLQ holds, with stable ``--json`` forms and a clear error for every
bad argument. Entries are fabricated directly (no worker); releases publish to the
session's private Redis broker, where no worker consumes them."""

from __future__ import annotations

import io
import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from relier_django import dlq as django_dlq
from relier_django.core.dlq.entries import iso
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model.envelope import decode
from relier_django.core.model.failure import Reason
from relier_django.core.store.keys import KeySpace
from relier_django.readers.render import utc_text
from testproject.demo import tasks
from testproject.harness import free_port
from tests import dlq_entries as entries
from tests.dlq_entries import untied

KEYS = KeySpace("rl")
DOCS = Path(__file__).resolve().parents[3] / "docs" / "dlq-command.md"
SUMMARY_KEYS = {
    "id", "task_id", "task", "reason", "queue", "error", "fence", "failed_at",
    "first_failed_at", "failures",
}  # fmt: skip
ENTRY_KEYS = SUMMARY_KEYS | {
    "exc_type", "exc_message", "traceback", "worker", "attempt", "envelope", "raw", "checkpoint",
    "history",
}  # fmt: skip


@pytest.fixture
def store(redis_client) -> DeadLetterStore:
    return django_dlq.store()


def fail(task=tasks.record, arg="x", **failure) -> str:
    return entries.fail(task, arg, **failure).id


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("relier_dlq", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args: str, match: str) -> str:
    """Run a command that must fail with ``match``; what it printed before failing."""
    out = io.StringIO()
    with pytest.raises(CommandError, match=match):
        call_command("relier_dlq", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def listed(*args: str) -> list[str]:
    """Every id a listing shows, following next_cursor to the end."""
    ids: list[str] = []
    cursor: list[str] = []
    while True:
        page = json.loads(run("list", "--json", *args, *cursor)[0])
        ids += [e["id"] for e in page["entries"]]
        if page["next_cursor"] is None:
            return ids
        cursor = ["--cursor", page["next_cursor"]]


def newest_first(store: DeadLetterStore, ids: list[str]) -> list[str]:
    return sorted(ids, key=lambda i: (-store.get(i).summary.failed_at_ms, i))


def failure(store: DeadLetterStore, entry_id: str) -> str:
    """How release and delete name the failure they acted on: its fence and time."""
    s = store.get(entry_id).summary
    return f"fence {s.fence}, failed {utc_text(s.failed_at_ms)} UTC"


def released_and_failed_again(entry_id: str) -> int:
    """Someone else releases the entry and its task fails again: the same id, a newer
    failure. Returns the fence that failure is at."""
    django_dlq.release_entry(entry_id)
    return entries.fail_again(entry_id).fence


class FakeTerminal(io.StringIO):
    """An interactive stdin whose operator types the given answer, or a terminal's
    stdout."""

    def isatty(self) -> bool:
        return True


def on_terminal(monkeypatch, *args: str, columns: int) -> str:
    """What a command prints to a terminal ``columns`` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))  # shutil.get_terminal_size reads it first
    out = FakeTerminal()
    call_command("relier_dlq", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def documented(command: str) -> str:
    """The output docs/dlq-command.md shows after ``$ python manage.py relier_dlq
    <command>``, up to the end of its code block."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index(f"$ python manage.py relier_dlq {command}\n")
    return text[text.index("\n", start) + 1 : text.index("```", start)]


def released(entry_id: str, fence: int = 2) -> dict:
    """``release --json``'s outcome of an entry released now, its task left queued."""
    return {"id": entry_id, "released": True, "why": None, "task_id": entry_id,
            "state": "queued", "fence": fence}  # fmt: skip


def not_released(entry_id: str, why: str | None) -> dict:
    return {"id": entry_id, "released": False, "why": why, "task_id": None,
            "state": None, "fence": None}  # fmt: skip


def redis_clock_ahead(monkeypatch, ms: int) -> None:
    """Make "now" on the Redis clock ``ms`` later than it is, as the command reads it."""
    real = DeadLetterStore.server_time_ms
    monkeypatch.setattr(DeadLetterStore, "server_time_ms", lambda self: real(self) + ms)


# -- list -------------------------------------------------------------------------


def test_list_shows_an_aligned_table_newest_first_with_a_count_footer(store, monkeypatch):
    ids = [fail(arg=f"t{i}", message=f"failure number {i} " + "x" * 200) for i in range(3)]
    out = on_terminal(monkeypatch, "list", columns=140)
    lines = out.splitlines()
    headers = ["ID", "FAILED AT (UTC)", "TASK", "REASON", "FENCE", "FAILURES", "ERROR"]
    assert re.split(r"\s{2,}", lines[0]) == headers
    rows = lines[1:4]
    assert [row.split()[0] for row in rows] == newest_first(store, ids)
    assert all(tasks.record.name in row and " exception " in row for row in rows)
    assert all(row.endswith("…") and len(row) == 140 for row in rows)  # cut to the terminal
    assert len({row.index("ValueError") for row in rows}) == 1  # the ERROR column aligns
    assert lines[-1] == "3 of 3 entries"


def test_list_piped_prints_each_error_whole_however_long(store, monkeypatch):
    """Issue 27: piped, the listing used to cut the error to 24 characters; not being a
    terminal, the StringIO gets every error's whole summary, whatever COLUMNS says."""
    monkeypatch.setenv("COLUMNS", "40")
    message = "the SMTP relay at mail.internal:587 refused the login: " + "y" * 120
    entry_id = fail(message=message)
    out, _ = run("list")
    (row,) = out.splitlines()[1:2]
    assert row.startswith(entry_id) and row.endswith(f"ValueError: {message}")
    assert "…" not in out


def test_list_wide_prints_the_whole_error_on_a_terminal_too(store, monkeypatch):
    message = "cannot process invoice-1043: " + "z" * 150
    fail(message=message)
    (cut,) = on_terminal(monkeypatch, "list", columns=80).splitlines()[1:2]
    assert cut.endswith("…") and message not in cut
    (whole,) = on_terminal(monkeypatch, "list", "--wide", columns=80).splitlines()[1:2]
    assert whole.endswith(f"ValueError: {message}") and whole[: len(cut) - 1] == cut[:-1]


def test_list_json_is_one_object_with_the_documented_keys(store):
    entry_id = fail(message="json me")
    page = json.loads(run("list", "--json")[0])
    assert set(page) == {"entries", "next_cursor", "matching"}
    assert page["next_cursor"] is None and page["matching"] == 1
    (summary,) = page["entries"]
    assert set(summary) == SUMMARY_KEYS
    assert summary["id"] == entry_id and summary["error"] == "ValueError: json me"
    assert summary["failed_at"].endswith("Z") and summary["fence"] == 1


def test_list_says_when_the_queue_is_empty_and_when_nothing_matches(store):
    assert run("list")[0] == "The dead-letter queue is empty.\n"
    fail()
    assert run("list", "--task", "demo.nothing")[0] == "No entries match.\n"
    assert json.loads(run("list", "--json", "--task", "demo.nothing")[0])["matching"] == 0


def test_list_filters_by_task_reason_and_both(store):
    a = fail(tasks.record, "a")
    b = fail(tasks.sync_record, "b", reason=Reason.RETRIES_EXHAUSTED)
    c = fail(tasks.sync_record, "c")
    assert listed("--task", tasks.sync_record.name) == newest_first(store, [b, c])
    assert listed("--reason", "exception") == newest_first(store, [a, c])
    assert listed("--task", tasks.sync_record.name, "--reason", "exception") == [c]
    out, _ = run("list", "--reason", "retries_exhausted")
    assert b in out and a not in out and out.splitlines()[-1] == "1 of 1 entry"


def test_since_is_measured_on_the_redis_clock(store, monkeypatch):
    ids = [fail(arg=f"s{i}") for i in range(2)]
    assert set(listed("--since", "30s")) == set(ids)
    # An hour later on the Redis clock, "the last 30 minutes" holds none of them.
    redis_clock_ahead(monkeypatch, 3_600_000)
    assert listed("--since", "30m") == []
    assert set(listed("--since", "2h")) == set(ids)
    assert set(listed("--since", "99999w")) == set(ids)  # before the epoch: from the start
    # A time bound makes the total unknown: the footer and the JSON say so.
    assert run("list", "--since", "2h")[0].splitlines()[-1] == "2 entries"
    assert json.loads(run("list", "--json", "--since", "2h")[0])["matching"] is None


def test_since_accepts_iso_dates_and_naive_datetimes_as_utc(store):
    entry_id = fail()
    now = datetime.now(UTC).replace(tzinfo=None)
    before = (now - timedelta(minutes=5)).isoformat(timespec="seconds")
    after = (now + timedelta(minutes=5)).isoformat(timespec="seconds")
    assert listed("--since", before) == [entry_id]
    assert listed("--since", after) == []
    assert listed("--since", (now - timedelta(days=1)).date().isoformat()) == [entry_id]
    assert listed("--since", after + "+05:00") == [entry_id]  # an explicit offset is honoured


def test_the_printed_cursor_pages_through_everything_once(store):
    ids = [fail(arg=f"p{i}") for i in range(7)]
    assert listed("--limit", "3") == newest_first(store, ids)
    out, _ = run("list", "--limit", "5")
    footer = out.splitlines()
    assert footer[-2] == "5 of 7 entries" and footer[-1].startswith("next page: --cursor ")
    rest, _ = run("list", "--limit", "5", "--cursor", footer[-1].split()[-1])
    assert rest.splitlines()[-1] == "2 of 7 entries"
    assert [line.split()[0] for line in rest.splitlines()[1:3]] == newest_first(store, ids)[5:]


# -- inspect ----------------------------------------------------------------------


def test_inspect_shows_the_error_traceback_envelope_and_history(store):
    entry_id = fail(tasks.sync_record, "argument-to-see", message="bad input")
    out, _ = run("inspect", entry_id)
    assert f"Entry:        {entry_id}" in out
    assert f"Task:         {tasks.sync_record.name}" in out and "Fence:        1" in out
    assert "ValueError: bad input" in out and "Traceback (most recent call last):" in out
    assert '"argument-to-see"' in out  # the envelope, pretty-printed
    history = out.split("History\n", 1)[1].splitlines()
    assert history[0].split()[:5] == ["TIME", "(UTC)", "EVENT", "FENCE", "WORKER"]
    assert history[1].split()[2:5] == ["dead", "1", "w1@host:1"]
    assert "exception: ValueError: bad input" in history[1]


def test_inspect_json_is_the_whole_entry(store):
    entry_id = fail(message="whole")
    shown = json.loads(run("inspect", entry_id, "--json")[0])
    assert set(shown) == ENTRY_KEYS
    assert shown == json.loads(json.dumps(store.get(entry_id).to_json()))
    assert shown["envelope"]["args"] == ["x"] and shown["raw"] is None


def test_the_documented_inspect_example_has_what_a_real_inspect_prints(store):
    """docs/dlq-command.md's ``inspect`` example against a real one: the same fields in
    the same order, the same sections, the same envelope keys (``schema_version`` was
    once missing), and its envelope is a real one (its checksum verifies)."""
    entry_id = fail(tasks.until_fixed, "invoice-1043")
    real, _ = run("inspect", entry_id)
    shown = documented("inspect 25b2cac0070f4e538e84b4391e3a3490")

    def labels(text: str) -> list[str]:
        return [line.split(":", 1)[0] for line in text.split("\n\n", 1)[0].splitlines()]

    def sections(text: str) -> list[str]:
        return [block.split("\n", 1)[0] for block in text.split("\n\n")[1:]]

    def envelope(text: str) -> dict:
        return json.loads(text.split("\nEnvelope\n", 1)[1].split("\n\nHistory\n", 1)[0])

    assert labels(shown) == labels(real)
    assert sections(shown) == sections(real) == ["Error", "Traceback", "Envelope", "History"]
    assert list(envelope(shown)) == list(envelope(real))
    assert "schema_version" in envelope(shown)
    assert decode(json.dumps(envelope(shown))).task == tasks.until_fixed.name
    history = shown.split("\nHistory\n", 1)[1].splitlines()[0]
    assert history.split() == real.split("\nHistory\n", 1)[1].splitlines()[0].split()


def test_inspect_shows_the_raw_body_of_a_message_that_is_no_envelope(store):
    entry_id = untied(raw="{broken json <b>")
    out, _ = run("inspect", entry_id)
    assert "Raw message (not an envelope)\n{broken json <b>" in out
    assert "Task:         ? (not tied to a task)" in out and "\nEnvelope\n" not in out


def test_inspect_of_an_unknown_id_is_an_error(store):
    refused("inspect", "no-such-id", match="no DLQ entry 'no-such-id'")


# -- release ----------------------------------------------------------------------


def test_release_dispatches_an_entry_once_and_a_second_release_fails(store):
    keep = fail(arg="keep")
    entry_id = fail(arg="go")
    read = failure(store, entry_id)
    out, _ = run("release", entry_id)
    assert out == f"released {entry_id} ({read}) as task {entry_id}\n"
    assert store.get(entry_id) is None and store.size() == 1 and listed() == [keep]
    out = refused("release", entry_id, match=rf"not released \(1 of 1\): {entry_id}")
    assert out == f"{entry_id}: no such entry in the dead-letter queue\n"


def test_release_processes_every_named_id_before_failing_on_the_bad_ones(store):
    good = fail(arg="good")
    bad = untied()
    read = failure(store, good)
    out = refused("release", "nope", good, bad, match=r"not released \(2 of 3\): nope " + bad)
    assert out.splitlines() == [
        "nope: no such entry in the dead-letter queue",
        f"released {good} ({read}) as task {good}",
        f"{bad}: it holds no envelope (a malformed message); inspect it",
    ]
    assert store.size() == 1 and store.get(bad) is not None


def test_release_json_names_each_ids_outcome_new_state_and_fence_or_why_not(store):
    """Issue 27: ``release --json`` is one document: each named id, released (its new
    incarnation queued at the next fence, as the store holds it) or why not, with
    the exit code of the line form."""
    good, bad = fail(arg="good"), untied()
    out = refused("release", good, "nope", bad, "--json", match=r"not released \(2 of 3\)")
    assert json.loads(out) == {
        "dry_run": False,
        "results": [
            released(good),
            not_released("nope", "no such entry in the dead-letter queue"),
            not_released(bad, "it holds no envelope (a malformed message); inspect it"),
        ],
    }
    assert store.client.hmget(KEYS.task(good), "state", "fence") == ["queued", "2"]
    assert store.get(good) is None and store.get(bad) is not None
    alone = fail(arg="alone")
    assert json.loads(run("release", alone, "--json")[0])["results"] == [released(alone)]


def test_release_json_of_a_stale_fence_says_which_failure_the_entry_holds(store):
    entry_id = fail(arg="pinned")
    newer = released_and_failed_again(entry_id)
    out = refused("release", entry_id, "--fence", "1", "--json", match="not released")
    (outcome,) = json.loads(out)["results"]
    assert outcome["released"] is False and f"holds the failure at fence {newer}" in outcome["why"]
    out, _ = run("release", entry_id, "--fence", str(newer), "--json")
    assert json.loads(out)["results"] == [released(entry_id, fence=newer + 1)]


def test_release_all_json_lists_the_released_the_refused_and_a_dry_runs_matches(store):
    ids = [fail(arg=f"j{i}") for i in range(2)]
    bad = untied()
    out, _ = run("release", "--all", "--dry-run", "--json")  # a dry run exits 0
    assert json.loads(out) == {
        "dry_run": True,
        "results": [not_released(i, None) for i in newest_first(store, ids)]
        + [not_released(bad, "it holds no envelope (a malformed message)")],
    }
    assert store.size() == 3
    out = refused("release", "--all", "--json", match="1 entry could not be released")
    doc = json.loads(out)
    assert doc["dry_run"] is False
    assert sorted(doc["results"][:2], key=lambda r: r["id"]) == [released(i) for i in sorted(ids)]
    assert doc["results"][2:] == [not_released(bad, "it holds no envelope (a malformed message)")]
    assert store.size() == 1


def test_release_json_as_documented_has_the_real_keys(store):
    entry_id = fail(arg="doc")
    out = refused("release", entry_id, "nope", "--json", match="not released")
    shown = documented("release 25b2cac0070f4e538e84b4391e3a3490 nope --json")
    example = json.loads(shown.split("\nCommandError:", 1)[0])
    real = json.loads(out)
    assert list(example) == list(real)
    assert [list(r) for r in example["results"]] == [list(r) for r in real["results"]]
    assert [r["released"] for r in example["results"]] == [True, False]


def test_release_all_dry_run_lists_matches_and_changes_nothing(store):
    ids = [fail(arg=f"d{i}") for i in range(3)]
    before = store.counts()
    out, _ = run("release", "--all", "--dry-run")
    assert out.splitlines() == [f"would release {i}" for i in newest_first(store, ids)] + [
        "3 entries would be released (dry run: nothing changed)."
    ]
    assert store.counts() == before


def test_release_all_releases_only_what_the_filters_match(store):
    timeouts = [fail(arg=f"t{i}", reason=Reason.HARD_TIMEOUT) for i in range(2)]
    other = fail(arg="other")
    out, _ = run("release", "--all", "--reason", "hard_timeout")
    assert sorted(out.splitlines()[:2]) == sorted(f"released {i}" for i in timeouts)
    assert out.splitlines()[-1] == "2 entries released."
    assert listed() == [other]


def test_release_all_reports_refusals_and_exits_non_zero(store):
    bad = untied()
    out = refused("release", "--all", match="1 entry could not be released")
    assert f"{bad}: it holds no envelope" in out and store.get(bad) is not None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((), r"give entry ids, or --all and filters \(not both\)"),
        (("some-id", "--all"), "not both"),
        (("some-id", "--reason", "exception"), "go with --all"),
        (("some-id", "--dry-run"), "go with --all"),
    ],
)
def test_release_needs_ids_or_all_but_not_both(store, args, match):
    with pytest.raises(CommandError, match=match) as raised:
        run("release", *args)
    assert raised.value.returncode == 2


# -- delete, purge ----------------------------------------------------------------


def test_delete_deletes_the_known_ids_and_fails_naming_the_unknown_ones(store):
    gone, kept = fail(arg="gone"), fail(arg="kept")
    read = failure(store, gone)
    out = refused(
        "delete", gone, "ghost-1", "ghost-2", match="no such DLQ entries: ghost-1 ghost-2$"
    )
    assert out == f"deleted {gone} ({read})\n"
    assert listed() == [kept]


# -- pinned to one failure (issue 18, item 7) ---------------------------------------


@pytest.mark.parametrize("action", ["delete", "release"])
def test_a_fenced_action_leaves_a_newer_failure_of_the_same_id_alone(store, redis_client, action):
    """G5: the operator read failure 1; the task was released and failed again before
    their ``--fence 1``. The newer failure, that task's only record, stays, and the
    error names the fence it is at."""
    entry_id = fail(arg="seen")
    seen = json.loads(run("inspect", entry_id, "--json")[0])["fence"]
    newer = released_and_failed_again(entry_id)
    sent = redis_client.llen("celery")
    assert newer == seen + 1
    out = refused(action, entry_id, "--fence", str(seen),
                  match=rf"{entry_id}.*holds the failure at fence {newer} now, not fence {seen}"
                        rf" .*pass --fence {newer}")  # fmt: skip
    assert "deleted" not in out and "released" not in out.replace("was released", "")
    now = store.get(entry_id)
    assert now is not None and now.fence == newer and now.summary.failures == 2
    assert redis_client.llen("celery") == sent  # nothing sent either


@pytest.mark.parametrize("action", ["delete", "release"])
def test_a_fenced_action_on_the_failure_the_entry_holds_goes_ahead(store, action):
    entry_id = fail(arg="pinned")
    newer = released_and_failed_again(entry_id)
    read = failure(store, entry_id)
    out, _ = run(action, entry_id, "--fence", str(newer))
    assert out.startswith(f"{action}d {entry_id} ({read})") and f"fence {newer}," in read
    assert store.get(entry_id) is None


def test_delete_without_fence_pins_the_failure_it_read_and_spares_one_landing_after(
    store, monkeypatch
):
    """G5: without ``--fence``, delete acts on the failure it reads (and prints). A
    failure that lands between that read and the delete is not deleted."""
    entry_id = fail(arg="raced")
    stale = store.get(entry_id)  # what the command reads ...
    newer = released_and_failed_again(entry_id)  # ... before the newer failure lands
    reads = iter([stale])
    real_get = DeadLetterStore.get
    monkeypatch.setattr(
        DeadLetterStore, "get", lambda self, i: next(reads, None) or real_get(self, i)
    )
    out = refused("delete", entry_id,
                  match=rf"{entry_id} not deleted: it holds the failure at fence {newer} now, "
                        rf"not fence {stale.fence}")  # fmt: skip
    assert out == ""
    assert store.get(entry_id).fence == newer


def test_release_and_delete_without_fence_act_on_the_failure_there_now_and_name_it(store):
    """Without ``--fence`` the current failure is taken, and the output says which one,
    so an operator who looked at an older one sees that it moved on."""
    released, deleted = fail(arg="r"), fail(arg="d")
    fences = {entry_id: released_and_failed_again(entry_id) for entry_id in (released, deleted)}
    read = {entry_id: failure(store, entry_id) for entry_id in fences}
    assert run("release", released)[0] == (
        f"released {released} ({read[released]}) as task {released}\n"
    )
    assert run("delete", deleted)[0] == f"deleted {deleted} ({read[deleted]})\n"
    assert all(f"fence {fences[i]}," in read[i] for i in fences) and store.size() == 0


def test_list_shows_the_fence_that_release_and_delete_take(store):
    entry_id = fail(arg="listed")
    newer = released_and_failed_again(entry_id)
    (row,) = run("list")[0].splitlines()[1:2]
    assert re.split(r"\s{2,}", row)[4:6] == [str(newer), "2"]
    assert json.loads(run("list", "--json")[0])["entries"][0]["fence"] == newer


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("delete", "a", "b", "--fence", "1"), "--fence pins one failure: give exactly one ID"),
        (("release", "a", "b", "--fence", "1"), "--fence pins one failure"),
    ],
)
def test_fence_pins_exactly_one_id(store, args, match):
    with pytest.raises(CommandError, match=match) as raised:
        run(*args)
    assert raised.value.returncode == 2


def test_fence_on_a_message_not_tied_to_a_task_is_refused(store):
    raw_id = untied()
    refused("delete", raw_id, "--fence", "1", match="not tied to a task.*leave out --fence")
    assert store.get(raw_id) is not None


def test_purge_with_yes_deletes_everything(store):
    for i in range(3):
        fail(arg=f"u{i}")
    assert run("purge", "--yes")[0] == "Deleted 3 entries.\n"
    assert store.size() == 0 and store.counts().by_task == {}


def test_purge_older_than_keeps_recent_failures(store, monkeypatch):
    fail(arg="recent")
    assert run("purge", "--older-than", "1h", "--yes")[0].startswith("Deleted 0 entries that")
    assert store.size() == 1
    redis_clock_ahead(monkeypatch, 2 * 3_600_000)
    assert run("purge", "--older-than", "1h", "--yes")[0].startswith("Deleted 1 entry that")
    assert store.size() == 0


def test_purge_without_yes_refuses_when_stdin_is_not_a_terminal(store, monkeypatch):
    fail()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # piped: not a terminal
    refused("purge", match="pass --yes")
    assert store.size() == 1


@pytest.mark.parametrize(("answer", "left"), [("y\n", 0), ("YES\n", 0), ("n\n", 2), ("", 2)])
def test_purge_asks_on_a_terminal_and_deletes_only_on_yes(store, monkeypatch, answer, left):
    fail(arg="a")
    fail(arg="b")
    monkeypatch.setattr(sys, "stdin", FakeTerminal(answer))
    out, _ = run("purge")
    assert out.startswith("Delete 2 entries for good? [y/N] ")
    assert out.endswith("Deleted 2 entries.\n" if left == 0 else "Aborted; nothing deleted.\n")
    assert store.size() == left


def test_an_entry_that_lands_while_the_operator_reads_the_prompt_is_not_purged(store, monkeypatch):
    fail(arg="counted")
    landed: list[str] = []

    class SlowOperator(FakeTerminal):
        def readline(self, size: int = -1) -> str:
            time.sleep(0.01)  # a new failure, later on the Redis clock than the question
            landed.append(fail(arg="landed-meanwhile"))
            return super().readline(size)

    monkeypatch.setattr(sys, "stdin", SlowOperator("y\n"))
    out, _ = run("purge")
    assert out.startswith("Delete 1 entry for good? [y/N] ")
    assert out.endswith("Deleted 1 entry.\n")
    assert listed() == landed  # not counted, so not deleted


def test_purge_prompt_counts_only_the_entries_older_than_the_cutoff(store, monkeypatch):
    fail(arg="old")
    time.sleep(0.01)
    cutoff = store.server_time_ms()
    time.sleep(0.01)
    new = [fail(arg=f"new{i}") for i in range(2)]
    monkeypatch.setattr(DeadLetterStore, "server_time_ms", lambda self: cutoff + 60_000)
    monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n"))
    out, _ = run("purge", "--older-than", "1m")
    assert out.startswith("Delete 1 entry that failed before ")
    assert "Deleted 1 entry that failed before " in out
    assert sorted(listed()) == sorted(new)
    monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n"))
    out, _ = run("purge", "--older-than", "1h")
    assert out.startswith("Nothing to purge: no entries that failed before ")
    assert store.size() == 2


# -- export, stats ----------------------------------------------------------------


def test_export_writes_whole_entries_as_json_lines(store, tmp_path):
    ids = [fail(arg=f"e{i}") for i in range(3)] + [untied()]
    target = tmp_path / "dlq.jsonl"
    out, err = run("export", "--output", str(target))
    assert out == "" and err == f"Exported 4 entries to {target}.\n"
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert {r["id"] for r in rows} == set(ids) and all(set(r) == ENTRY_KEYS for r in rows)
    out, _ = run("export", "--reason", "malformed_message")
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["raw"] == "<not json>" and row["envelope"] is None


def test_export_to_an_unwritable_path_is_an_error(store, tmp_path):
    fail()
    refused("export", "--output", str(tmp_path / "missing" / "x.jsonl"), match="cannot write")


def test_stats_counts_by_reason_task_and_both_with_the_oldest_and_newest_failure(store):
    first = fail(tasks.record, "a")
    fail(tasks.record, "b")
    last = fail(tasks.sync_record, "c", reason=Reason.HARD_TIMEOUT)
    data = json.loads(run("stats", "--json")[0])
    assert data == {
        "total": 3,
        "by_reason": {"exception": 2, "hard_timeout": 1},
        "by_task": {tasks.record.name: 2, tasks.sync_record.name: 1},
        "by_reason_and_task": [
            {"reason": "exception", "task": tasks.record.name, "count": 2},
            {"reason": "hard_timeout", "task": tasks.sync_record.name, "count": 1},
        ],
        "oldest_failure_at": iso(store.get(first).summary.failed_at_ms),
        "newest_failure_at": iso(store.get(last).summary.failed_at_ms),
    }
    out, _ = run("stats")
    assert out.startswith("3 entries; failures from ")
    assert [line.split() for line in out.split("\n\n")[1].splitlines()] == [
        ["REASON", "ENTRIES"], ["exception", "2"], ["hard_timeout", "1"],
    ]  # fmt: skip
    assert [line.split() for line in out.split("\n\n")[3].splitlines()][2] == [
        "hard_timeout", tasks.sync_record.name, "1",
    ]  # fmt: skip


def test_stats_of_an_empty_queue(store):
    assert run("stats")[0] == "The dead-letter queue is empty.\n"
    data = json.loads(run("stats", "--json")[0])
    assert data["total"] == 0 and data["newest_failure_at"] is data["oldest_failure_at"] is None
    assert data["by_reason_and_task"] == []


# -- errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("list", "--reason", "bogus"), r"invalid choice: 'bogus'.*'exception'"),
        (("list", "--since", "yesterday"), "neither a duration .* nor an ISO 8601"),
        (("list", "--since", "5 minutes"), "neither a duration"),
        (("list", "--limit", "0"), "--limit: must be a whole number from 1 to 1000"),
        (("list", "--limit", "1001"), "from 1 to 1000"),
        (("list", "--limit", "ten"), "from 1 to 1000"),
        (("list", "--cursor", "page-2"), "not a DLQ cursor: 'page-2'"),
        (("purge", "--older-than", "7 days", "--yes"), "--older-than: '7 days' is neither"),
        (("export", "--reason", "timeout"), "invalid choice"),
        (("delete",), "the following arguments are required: ID"),
        (("delete", "a", "--fence", "one"), "--fence: 'one' is not a fence: give the FENCE"),
        (("release", "a", "--fence", "-1"), "--fence: '-1' is not a fence"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        ((), "the following arguments are required: SUBCOMMAND"),
    ],
)
def test_a_bad_argument_is_a_command_error_that_says_what_to_give(store, args, match):
    fail()
    refused(*args, match=match)
    assert store.size() == 1


# An unreachable Redis, every subcommand, password hidden: admin/test_redis_down.py.


def test_a_release_with_the_broker_down_changes_nothing_and_a_rerun_releases(store):
    from testproject.harness import process_pointed_at

    ids = [fail(arg="b1"), fail(arg="b2")]
    before = {entry_id: store.get(entry_id) for entry_id in ids}
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    quick = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}
    with process_pointed_at({"CELERY_BROKER_URL": closed}, task_publish_retry_policy=quick):
        refused("release", ids[0], match="cannot reach the Celery broker")
        printed = refused("release", "--all", match="cannot reach the Celery broker")
        as_json = refused("release", "--all", "--json", match="cannot reach the Celery broker")
    assert "released" not in printed
    assert json.loads(as_json) == {"dry_run": False, "results": []}  # printed all the same
    # Every entry exactly as it was, in every index; no task re-created.
    assert {entry_id: store.get(entry_id) for entry_id in ids} == before
    assert store.size() == 2 and store.counts().total == 2
    assert not any(store.client.exists(KEYS.task(entry_id)) for entry_id in ids)

    out, _ = run("release", "--all")  # the broker is back
    assert sorted(re.findall(r"released (\w+)", out)) == sorted(ids)
    assert store.size() == 0
    assert all(store.client.hget(KEYS.task(i), "state") == "queued" for i in ids)
