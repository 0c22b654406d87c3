"""The heartbeat lock (docs/lock.md): L1 one holder at a time, L2 fencing tokens only
go up, L3 a live holder keeps the lock and a dead one's frees itself within one TTL,
L4 a lost lock is signalled and release never deletes another holder's lock.

Covers lock_acquire.lua, lock_extend.lua and lock_release.lua, with their races: many
threads and many processes acquiring at once.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from relier_django.core.extras.lock import Lock, lock
from relier_django.core.model import config
from relier_django.core.model.errors import LockLost, LockNotAcquired, RelierError
from relier_django.core.store.connection import close_loop_clients
from relier_django.core.store.keys import KeySpace
from testproject.harness import REPO_ROOT, wait_until

KEYS = KeySpace("rl")


def _stored_token(client, name: str) -> int | None:
    raw = client.get(KEYS.lock(name))
    return None if raw is None else int(raw)


def _take_over(client, name: str, token: int) -> None:
    """What another holder's acquisition looks like from the key's point of view."""
    client.set(KEYS.lock(name), token, px=60_000)


# -- L1, L2: acquire, release, tokens -------------------------------------------------
def test_acquire_sets_the_key_with_a_ttl_and_release_frees_it(redis_client):
    lk = lock("init", ttl=5)
    assert lk.acquire()
    assert _stored_token(redis_client, "init") == lk.token
    assert 0 < redis_client.pttl(KEYS.lock("init")) <= 5_000
    assert redis_client.ttl(KEYS.lock_token("init")) == -1  # the counter never expires
    token = lk.token
    assert lk.release() is True
    assert lk.token is None
    assert not redis_client.exists(KEYS.lock("init"))
    assert int(redis_client.get(KEYS.lock_token("init"))) == token  # counter left alone
    assert lk.release() is False  # nothing left to release


def test_tokens_increase_across_every_acquisition_of_a_name(redis_client):
    reused = lock("tokens", ttl=5)
    tokens = []
    for i in range(6):
        lk = reused if i % 2 else lock("tokens", ttl=5)
        assert lk.acquire()
        tokens.append(lk.token)
        if i == 3:
            redis_client.delete(KEYS.lock("tokens"))  # expired meanwhile: still goes up
        lk.release()
    assert tokens == sorted(set(tokens))
    other = lock("other", ttl=5)
    assert other.acquire() and other.token == 1  # each name counts on its own, from 1
    other.release()


def test_a_non_blocking_attempt_fails_at_once_while_the_lock_is_held(redis_client):
    with lock("held", ttl=5) as holder:
        contender = lock("held", blocking=False)
        assert contender.acquire() is False
        assert contender.token is None
        with pytest.raises(LockNotAcquired) as refused, lock("held", blocking=False):
            pytest.fail("entered a lock another holder has")
        assert (refused.value.name, refused.value.timeout) == ("held", 0.0)
        assert isinstance(refused.value, RelierError)
        assert _stored_token(redis_client, "held") == holder.token


def test_a_blocking_attempt_gives_up_after_its_timeout(redis_client):
    with lock("slow", ttl=5):
        started = time.monotonic()
        assert lock("slow", timeout=0.3).acquire() is False
        assert time.monotonic() - started >= 0.3
        with pytest.raises(LockNotAcquired) as refused, lock("slow", timeout=0.2):
            pytest.fail("entered a lock another holder has")
        assert refused.value.timeout == 0.2


def test_a_blocking_attempt_succeeds_once_another_thread_releases(redis_client):
    holder = lock("handover", ttl=5)
    assert holder.acquire()
    first = holder.token
    releaser = threading.Timer(0.3, holder.release)
    releaser.start()
    waiter = lock("handover", timeout=10)
    try:
        assert waiter.acquire()
        assert waiter.token > first
        assert _stored_token(redis_client, "handover") == waiter.token
    finally:
        releaser.join()
        waiter.release()


def test_of_many_threads_acquiring_at_once_exactly_one_wins(redis_client):
    n = 16
    barrier = threading.Barrier(n)
    winners: list[int] = []

    def contend() -> None:
        lk = lock("race", ttl=5, blocking=False)
        barrier.wait()
        if lk.acquire():
            winners.append(lk.token)
        barrier.wait()  # the winner holds until every thread has tried
        lk.release()

    threads = [threading.Thread(target=contend) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1
    assert int(redis_client.get(KEYS.lock_token("race"))) == winners[0]  # no token wasted


# -- L3: the heartbeat ---------------------------------------------------------------
def test_a_holder_running_five_times_the_ttl_keeps_the_lock(redis_client):
    contender = lock("long", blocking=False)
    with lock("long", ttl=0.6) as holder:
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            assert contender.acquire() is False
            assert redis_client.pttl(KEYS.lock("long")) > 0
            time.sleep(0.05)
        assert _stored_token(redis_client, "long") == holder.token
        assert not holder.lost.is_set()
        holder.ensure_held()
    assert not redis_client.exists(KEYS.lock("long"))


def test_async_with_holds_extends_and_releases_on_the_running_loop(redis_client):
    async def main() -> tuple[int | None, bool]:
        try:
            async with lock("async", ttl=0.6) as lk:
                with pytest.raises(RuntimeError, match="aacquire"):
                    lock("async-other").acquire()  # a sync call would stall this loop
                until = time.monotonic() + 1.5  # the heartbeat runs on this loop
                while time.monotonic() < until:
                    assert redis_client.pttl(KEYS.lock("async")) > 0
                    await asyncio.sleep(0.05)
                assert not await lock("async", blocking=False).aacquire()
                token = lk.token
                assert _stored_token(redis_client, "async") == token
            return token, await lk.arelease()
        finally:
            await close_loop_clients()

    token, released_again = asyncio.run(main())
    assert token is not None and released_again is False
    assert not redis_client.exists(KEYS.lock("async"))


# -- L4: losing the lock and releasing it ----------------------------------------------
def test_release_of_a_lock_no_longer_owned_leaves_the_new_holders_lock_intact(redis_client):
    stale = lock("owned", ttl=5)
    assert stale.acquire()
    redis_client.delete(KEYS.lock("owned"))  # it expired, as after a long pause
    successor = lock("owned", ttl=5)
    assert successor.acquire()
    assert stale.release() is False
    assert _stored_token(redis_client, "owned") == successor.token
    assert redis_client.pttl(KEYS.lock("owned")) > 0
    assert successor.release() is True


def test_a_lost_lock_is_signalled_by_event_callback_and_ensure_held(redis_client):
    calls: list[Lock] = []
    with lock("lose", ttl=0.6, on_lost=calls.append) as lk:
        token = lk.token
        _take_over(redis_client, "lose", token + 100)
        assert lk.lost.wait(0.2 + 1.0)  # one heartbeat period, plus slack
        wait_until(lambda: calls, 1, what="on_lost")  # called just after lost is set
        assert calls == [lk]
        with pytest.raises(LockLost) as lost:
            lk.ensure_held()
        assert (lost.value.name, lost.value.token) == ("lose", token)
    # Already raised inside the block: the exit does not raise it twice, and the other
    # holder's lock is untouched.
    assert _stored_token(redis_client, "lose") == token + 100
    assert not issubclass(LockLost, Exception)


def test_exiting_the_with_block_of_a_lost_lock_raises_lock_lost(redis_client):
    with pytest.raises(LockLost) as lost, lock("lose-exit", ttl=0.6) as lk:
        token = lk.token
        _take_over(redis_client, "lose-exit", token + 100)
        assert lk.lost.wait(1.2)
    assert lost.value.token == token
    # An ordinary exception from the body does not hide the loss; it stays attached.
    with pytest.raises(LockLost) as lost, lock("lose-exit-2", ttl=0.6) as lk:
        _take_over(redis_client, "lose-exit-2", lk.token + 100)
        assert lk.lost.wait(1.2)
        raise ValueError("the body failed too")
    assert isinstance(lost.value.__context__, ValueError)


def test_no_extension_confirmed_for_a_whole_ttl_counts_as_lost(redis_client, caplog):
    # A pause the process cannot see from inside (GC, SIGSTOP): its clock jumps by a
    # TTL before the heartbeat, frozen with it, could run. The key may have expired.
    now = [0.0]

    def on_lost(lk: Lock) -> None:
        raise RuntimeError("a broken callback")

    lk = Lock("paused", 5.0, config=config.current(), on_lost=on_lost, clock=lambda: now[0])
    assert lk.acquire()
    lk.ensure_held()
    now[0] = 5.0
    with pytest.raises(LockLost):
        lk.ensure_held()
    assert lk.lost.is_set()
    assert "lock lost lock=paused token=1 reason=unconfirmed_for_ttl" in caplog.text
    assert "on_lost callback failed lock=paused" in caplog.text  # logged, not swallowed
    assert lk.release() is True  # the key was still ours: compare-and-delete frees it


def test_except_exception_in_user_code_cannot_swallow_lock_lost(redis_client):
    with pytest.raises(LockLost), lock("swallow", ttl=0.6) as lk:
        _take_over(redis_client, "swallow", lk.token + 100)
        assert lk.lost.wait(1.2)
        try:
            lk.ensure_held()
        except Exception:
            pytest.fail("except Exception caught LockLost")


def test_an_async_holder_learns_of_the_loss_and_async_with_raises(redis_client):
    calls: list[Lock] = []

    async def main() -> None:
        try:
            async with lock("alose", ttl=0.6, on_lost=calls.append) as lk:
                _take_over(redis_client, "alose", lk.token + 100)
                # Wait off the loop: the heartbeat that finds the loss runs on it.
                assert await asyncio.to_thread(lk.lost.wait, 1.2)
                assert calls == [lk]
        finally:
            await close_loop_clients()

    with pytest.raises(LockLost):
        asyncio.run(main())
    assert _stored_token(redis_client, "alose") is not None  # the other holder's, intact


# -- across processes ----------------------------------------------------------------
_PRELUDE = """
import sys, time
import redis
from relier_django.core.model import config
from relier_django.core.extras.lock import lock
config.override(config.Config(redis_url=sys.argv[1]))
r = redis.Redis.from_url(sys.argv[1], decode_responses=True)
"""


class _Child:
    """A Python process running ``body`` against the private Redis; lines it prints
    (stdout and stderr) are collected by a reader thread."""

    def __init__(self, url: str, body: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        code = _PRELUDE + textwrap.dedent(body)
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, url, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, cwd=REPO_ROOT, env=env, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, prefix: str | tuple[str, ...], timeout_s: float = 60) -> list[str]:
        """The words of the next line starting with ``prefix``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line; output: {self.seen}") from None
            self.seen.append(line)
            if line.startswith(prefix):
                return line.split()

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # by its PID only
        self.process.wait(30)


@pytest.fixture
def children(redis_server, redis_client):
    started: list[_Child] = []

    def start(body: str, *args: str) -> _Child:
        child = _Child(redis_server.url, body, *args)
        started.append(child)
        return child

    yield start
    for child in started:
        child.stop()


def test_of_processes_contending_exactly_one_acquires(children, redis_client):
    n = 4
    contend = """
        n = int(sys.argv[2])
        r.incr("test:ready")
        while int(r.get("test:ready")) < n:  # start together
            time.sleep(0.002)
        lk = lock("contended", ttl=2, blocking=False)
        if lk.acquire():
            print("won", lk.token, flush=True)
            while int(r.get("test:tried") or 0) < n - 1:  # hold until all others tried
                time.sleep(0.01)
            lk.release()
        else:
            r.incr("test:tried")
            print("lost", flush=True)
    """
    procs = [children(contend, str(n)) for _ in range(n)]
    outcomes = [p.expect(("won", "lost")) for p in procs]
    winners = [words for words in outcomes if words[0] == "won"]
    assert len(winners) == 1, outcomes
    assert int(winners[0][1]) == 1
    for p in procs:
        assert p.process.wait(30) == 0


def test_a_sigkilled_holders_lock_frees_within_its_ttl_and_the_next_token_is_higher(
    children, redis_client
):
    ttl = 1.0
    holder = children(
        """
        lk = lock("crash", ttl=float(sys.argv[2]))
        assert lk.acquire()
        print("acquired", lk.token, flush=True)
        time.sleep(600)
        """,
        str(ttl),
    )
    first = int(holder.expect("acquired")[1])
    time.sleep(2 * ttl)  # its heartbeat, in another process, keeps it past the TTL
    assert lock("crash", blocking=False).acquire() is False

    os.kill(holder.process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    successor = lock("crash", ttl=ttl, timeout=ttl + 1.0)
    assert successor.acquire(), "the dead holder's lock did not free itself in time"
    assert time.monotonic() - killed_at <= ttl + 1.0
    assert successor.token > first
    successor.release()


def test_a_paused_holder_learns_it_lost_the_lock_and_cannot_release_the_successors(
    children, redis_client
):
    paused = children(
        """
        calls = []
        lk = lock("zombie", ttl=0.5, on_lost=calls.append)
        assert lk.acquire()
        print("acquired", lk.token, flush=True)
        sys.stdin.readline()  # the test SIGSTOPs us here, then SIGCONTs and writes
        lost = lk.lost.wait(2.0)
        deadline = time.monotonic() + 1  # on_lost is called just after lost is set
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            lk.ensure_held()
            raised = "none"
        except BaseException as exc:
            raised = type(exc).__name__
        print("after", lost, len(calls), raised, lk.release(), flush=True)
        """
    )
    first = int(paused.expect("acquired")[1])
    os.kill(paused.process.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: not redis_client.exists(KEYS.lock("zombie")), 5, what="expiry")
        successor = lock("zombie", ttl=5)
        assert successor.acquire()
        assert successor.token > first
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)
    paused.send("go")
    assert paused.expect("after")[1:] == ["True", "1", "LockLost", "False"]
    assert _stored_token(redis_client, "zombie") == successor.token
    assert successor.release() is True


def test_names_and_durations_that_cannot_work_are_refused():
    for bad in ("", "a{b", "a}b"):
        with pytest.raises(ValueError, match="braces"):
            lock(bad)
    for kwargs in ({"ttl": 0}, {"timeout": -1}, {"poll_interval": 0}):
        with pytest.raises(ValueError, match=r"ttl >= 0\.001"):
            lock("x", **kwargs)


def test_the_lock_follows_the_configured_key_prefix(redis_client):
    custom = config.current().replace(key_prefix="other")
    lk = Lock("prefixed", 5.0, config=custom)
    assert lk.acquire()
    assert redis_client.exists(KeySpace("other").lock("prefixed"))
    assert lk.release()
