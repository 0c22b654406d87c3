"""Reading and managing the DLQ: lookups, filtered cursor pages, counts, delete, purge.

Listings page through the lex index (see ``lua/_dlq_index.lua``) with one
ZRANGEBYLEX from a cursor, so a page costs O(log N + page size) at any depth and
with any filter: the cost does not grow with the DLQ. Entries leave only through
``release``, ``delete`` or ``purge``; nothing here expires them.

Partitions (``KeySpace.parts``): each partition indexes its own entries, and every
reader here reads them all. A page reads the same lex range of every partition's
index in one pipelined round trip and merges them. A member's bytes are its sort key
(the query's prefix, the inverted failure time, the entry id) and an entry lives in
one partition, so no two members tie: the merge is the order one index would have,
and a cursor (a page's last member) is a bound every partition resumes from exactly.
A page costs O(P * (log N + page size)) for P partitions, at any depth.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.client import Pipeline

from ..store import checkpoint, chords, scripts
from ..store.keys import KeySpace
from .entries import SUMMARY_FIELDS, Entry, Summary

_US = b"\x1f"  # US in _dlq_index.lua; test_dlq_store.py checks the layouts agree
_TOP = b"\xff"  # above every byte of a member's tail
_INV = 9999999999999
MAX_PAGE = 1000


def _inv(ms: int) -> bytes:
    return b"%013d" % (_INV - ms)


@dataclass(frozen=True, slots=True)
class Query:
    """Which entries to list. ``since_ms``: only failures at or after (Redis clock)."""

    task: str | None = None
    reason: str | None = None
    since_ms: int | None = None

    def prefix(self) -> bytes:
        if self.task is not None and self.reason is not None:
            return b"p" + _US + self.reason.encode() + _US + self.task.encode() + _US
        if self.task is not None:
            return b"t" + _US + self.task.encode() + _US
        if self.reason is not None:
            return b"r" + _US + self.reason.encode() + _US
        return b"a" + _US


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the previous page ended: its last entry's failure time and id.

    Opaque to callers as ``str(cursor)``; still valid if that entry has since left.
    """

    at_ms: int
    entry_id: str

    def __str__(self) -> str:
        return f"{self.at_ms}:{self.entry_id}"

    @classmethod
    def after(cls, member: str) -> Cursor:
        """The cursor just past a lex index member (``...US<inv>US<id>``)."""
        *_, inv, entry_id = member.split("\x1f")
        return cls(_INV - int(inv), entry_id)

    @classmethod
    def parse(cls, text: str) -> Cursor:
        at, sep, entry_id = text.partition(":")
        if not (sep and at.isdigit() and entry_id):
            raise ValueError(f"not a DLQ cursor: {text!r} (expected the next_cursor of a page)")
        return cls(int(at), entry_id)


@dataclass(frozen=True, slots=True)
class Page:
    entries: tuple[Summary, ...]
    next_cursor: Cursor | None  # None: this was the last page


@dataclass(frozen=True, slots=True)
class Counts:
    """How many entries, in all and by task, reason, and (reason, task)."""

    total: int
    by_task: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    by_reason_and_task: dict[tuple[str, str], int] = field(default_factory=dict)

    def matching(self, query: Query) -> int | None:
        """Entries matching ``query``; None when a time bound makes it unknown."""
        if query.since_ms is not None:
            return None
        if query.task is not None and query.reason is not None:
            return self.by_reason_and_task.get((query.reason, query.task), 0)
        if query.task is not None:
            return self.by_task.get(query.task, 0)
        if query.reason is not None:
            return self.by_reason.get(query.reason, 0)
        return self.total


def lex_member(query: Query, at_ms: int, entry_id: str) -> bytes:
    """The lex index member, under ``query``'s prefix, of entry ``entry_id`` that failed
    at ``at_ms`` (ms, Redis clock): the member ``_dlq_index.lua`` writes for it."""
    return query.prefix() + _inv(at_ms) + _US + entry_id.encode()


def lex_range(query: Query, cursor: Cursor | None) -> tuple[bytes, bytes]:
    """The ZRANGEBYLEX bounds of ``query``'s entries after ``cursor``, newest first."""
    prefix = query.prefix()
    low = b"[" + prefix
    if cursor is not None:
        low = b"(" + lex_member(query, cursor.at_ms, cursor.entry_id)
    high = b"[" + prefix + _TOP
    if query.since_ms is not None:
        # Before the epoch means "since always": the inverted time has 13 digits.
        high = b"[" + prefix + _inv(max(0, query.since_ms)) + _US + _TOP
    return low, high


class DeadLetterStore:
    """The DLQ of one key space on one Redis (or Redis Cluster): every partition's.

    Args:
        client: a client with decoded (str) replies, as ``connection.sync_client``.
        keys: the key space (``KeySpace.of(config)``).
        checkpoint_dir: ``config.checkpoint_dir``: where a deleted entry's checkpoint
            files are removed from.
    """

    def __init__(
        self, client: redis.Redis, keys: KeySpace, checkpoint_dir: str | None = None
    ) -> None:
        self.client = client
        self.keys = keys
        self.checkpoint_dir = checkpoint_dir

    def _each(self, ask: Callable[[Pipeline, KeySpace], object]) -> list[Any]:
        """The replies of the reads ``ask`` queues for each partition, partition by
        partition in ``parts()`` order. One round trip, no MULTI (a cluster would refuse
        one over several slots): each partition's reads are read as they are then."""
        with self.client.pipeline(transaction=False) as pipe:
            for p in self.keys.parts():
                ask(pipe, p)
            return list(pipe.execute())

    def get(self, entry_id: str) -> Entry | None:
        """The whole entry, or None if no entry has this id (or it is being released)."""
        # The store's clients decode replies (connection.py): every reply is str.
        fields = cast("dict[str, str]", self.client.hgetall(self.keys.dlq_entry(entry_id)))
        if not fields or "entry" not in fields or "releasing" in fields:
            return None
        return Entry.from_fields(entry_id, fields)

    def size(self) -> int:
        return sum(int(n) for n in self._each(lambda pipe, p: pipe.zcard(p.dlq)))

    def count_failed_before(self, ms: int) -> int:
        """Entries whose latest failure is at or before ``ms`` (what ``purge`` deletes)."""
        return sum(int(n) for n in self._each(lambda pipe, p: pipe.zcount(p.dlq, "-inf", ms)))

    def span(self) -> tuple[int, int] | None:
        """The oldest and the newest failure time in the DLQ (ms), or None when empty."""

        def ends(pipe: Pipeline, p: KeySpace) -> None:
            pipe.zrange(p.dlq, 0, 0, withscores=True)
            pipe.zrange(p.dlq, -1, -1, withscores=True)

        # Each partition's two ends, in one round trip: the oldest of all is the least
        # of the oldest ends, the newest the greatest of the newest ones.
        found = [int(score) for reply in self._each(ends) for _, score in reply]
        return (min(found), max(found)) if found else None

    def counts(self) -> Counts:
        """Entries in all and by task, reason and both. Each partition's size and counts
        are read in one MULTI, so ``total`` is the sum of ``by_task`` (and of
        ``by_reason``) even while entries come and go."""
        by_task: dict[str, int] = {}
        by_reason: dict[str, int] = {}
        pairs: dict[tuple[str, str], int] = {}
        total = 0
        for p in self.keys.parts():
            # A round trip per partition: a MULTI may touch one cluster slot only.
            with self.client.pipeline(transaction=True) as pipe:
                pipe.zcard(p.dlq)
                pipe.hgetall(p.dlq_counts)
                size, raw = pipe.execute()
            total += int(size)
            for name, value in raw.items():
                kind, _, rest = name.partition("\x1f")
                if kind == "t":
                    by_task[rest] = by_task.get(rest, 0) + int(value)
                elif kind == "r":
                    by_reason[rest] = by_reason.get(rest, 0) + int(value)
                elif kind == "p":
                    reason, _, task = rest.partition("\x1f")
                    pairs[(reason, task)] = pairs.get((reason, task), 0) + int(value)
        return Counts(total, by_task, by_reason, pairs)

    def page(self, query: Query = Query(), cursor: Cursor | None = None, limit: int = 50) -> Page:
        """Summaries matching ``query``, newest failure first, after ``cursor``.

        Raises:
            ValueError: ``limit`` outside 1..MAX_PAGE.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        low, high = lex_range(query, cursor)
        # The first limit + 1 after the cursor of each partition hold the first
        # limit + 1 of all. Members are str here: code point order is the byte order
        # of their UTF-8, ZRANGEBYLEX's order, so the merge keeps the index's order.
        ranges = cast(
            "list[list[str]]",
            self._each(
                lambda pipe, p: pipe.zrangebylex(p.dlq_lex, low, high, start=0, num=limit + 1)
            ),
        )
        members = list(itertools.islice(heapq.merge(*ranges), limit + 1))
        ids = [m.rsplit("\x1f", 1)[1] for m in members[:limit]]
        summaries = self._summaries(ids)
        more = len(members) > limit
        nxt = Cursor.after(members[limit - 1]) if more else None
        return Page(tuple(summaries), nxt)

    def _summaries(self, ids: Sequence[str]) -> list[Summary]:
        with self.client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.hmget(self.keys.dlq_entry(entry_id), SUMMARY_FIELDS)
            rows = pipe.execute()
        out = []
        for entry_id, row in zip(ids, rows, strict=True):
            fields = {k: v for k, v in zip(SUMMARY_FIELDS, row, strict=True) if v is not None}
            if "at_ms" in fields:  # gone since the index was read: skip it
                out.append(Summary.from_fields(entry_id, fields))
        return out

    def iter(self, query: Query = Query(), batch: int = 500) -> Iterator[Entry]:
        """Every entry matching ``query``, whole, newest first, ``batch`` at a time."""
        cursor: Cursor | None = None
        while True:
            page = self.page(query, cursor, batch)
            for summary in page.entries:
                entry = self.get(summary.id)
                if entry is not None:
                    yield entry
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def delete(self, entry_ids: Sequence[str], fences: Sequence[int | None] = ()) -> list[str]:
        """Delete entries for good; returns the ids actually deleted, in the order
        given.

        ``fences[i]`` pins the i-th delete to the failure the operator saw (an entry's
        ``fence``): a task that failed again meanwhile keeps its newer entry.
        """
        return self._delete(entry_ids, fences, max_at_ms=None)

    def server_time_ms(self) -> int:
        """Now on the Redis clock, the clock every entry's failure time is on."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def purge(self, failed_before_ms: int | None = None, batch: int = 500) -> int:
        """Delete every entry whose latest failure is at or before ``failed_before_ms``
        (Redis clock; None: every entry). Returns how many were deleted."""
        cutoff = self.server_time_ms() if failed_before_ms is None else failed_before_ms
        # One partition after another: a batch is one partition's, for one script call.
        return sum(self._purge(p, cutoff, batch) for p in self.keys.parts())

    def _purge(self, part: KeySpace, cutoff: int, batch: int) -> int:
        deleted = 0
        kept: set[str] = set()
        while True:
            ids = cast(
                "list[str]",
                self.client.zrangebyscore(part.dlq, "-inf", cutoff, start=0, num=batch),
            )
            # A batch released under us leaves the index, so the next read moves on;
            # only ids the script refused while still indexed could come back forever.
            if not ids or kept.issuperset(ids):
                return deleted
            gone = self._delete(ids, (), max_at_ms=cutoff)
            kept = set(ids).difference(gone)
            deleted += len(gone)

    def _delete(
        self, entry_ids: Sequence[str], fences: Sequence[int | None], max_at_ms: int | None
    ) -> list[str]:
        padded = list(fences) + [None] * (len(entry_ids) - len(fences))
        wanted = dict(zip(entry_ids, padded, strict=True))  # an id named twice counts once
        done: set[str] = set()
        # One script call per partition, with that partition's entries: a script's keys
        # must share a cluster slot. Each call has its own token (its receipt's key).
        for part, ids in self.keys.by_partition(wanted).items():
            args: list[scripts.Arg] = [
                "" if max_at_ms is None else max_at_ms,
                scripts.REPLAY_WINDOW_MS,
            ]
            for entry_id in ids:
                fence = wanted[entry_id]
                args += [entry_id, "" if fence is None else fence]
            args.append(chords.KEEP_MS)
            # A chord member's chord, whose state the script gives a TTL back: the
            # field is written once, when the entry is filed. On a partitioned store a
            # chord's state always keeps its TTL (never sealed), and lives in another
            # partition: nothing to give back.
            groups: list[str | None] = [None] * len(ids)
            if not self.keys.tagged:
                pipe = self.client.pipeline(transaction=False)
                for entry_id in ids:
                    pipe.hget(part.dlq_entry(entry_id), "chord")
                groups = [str(g) if g else None for g in pipe.execute()]
            token = uuid.uuid4().hex
            keys = part.for_dlq_delete(ids, token, groups)
            replies = scripts.DLQ_DELETE.run(self.client, keys, args)
            done.update(entry_id for entry_id, ok in zip(ids, replies, strict=True) if int(ok))
        deleted = [entry_id for entry_id in wanted if entry_id in done]
        for entry_id in deleted:  # the entry id is its task's id
            checkpoint.remove_files(self.checkpoint_dir, entry_id)
        return deleted
