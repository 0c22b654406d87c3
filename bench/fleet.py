"""The fleet simulator: what a fleet of idle workers costs the store's Redis, by size,
and how fast a process death is still found (issue 37).

One private Redis; N simulated workers of ``--procs`` processes each (8 by default).
Every simulated process holds a liveness connection exactly as relier's processes do
(``CLIENT SETNAME <prefix>|<id>`` then ``SUBSCRIBE <prefix>:alive``, then registered
in ``<prefix>:holders``), and so does every simulated worker's scanner: N x (procs + 1)
listed connections. They are raw sockets in one asyncio loop: the server sees the same
connections and the same commands, without a thread per process.

The scanners' death checks, every ``deaths.CHECK_S``:

- the leader is relier's own code: a real ``Deaths`` (``check(watch=False)``) in a
  thread, on its own redis-py client. The recovery time is read from it;
- the N - 1 others replay on raw sockets the commands a follower's check sends, for
  the scheme chosen with ``--scheme``:

  - ``all-list`` (relier up to 0.x, before issue 37): every scanner sends ``TIME``,
    ``INFO server``, ``CLIENT LIST TYPE pubsub``, ``SMEMBERS holders``;
  - ``leader-lists`` (now): relier's own ``Deaths.check(watch=True)``, one ``Deaths``
    per follower, all run in turn from one thread, each every ``deaths.WATCH_S``:
    ``CLIENT LIST ID <leader's connection>``, and ``GET`` of the leader key once every
    ``deaths.LEADER_READ_EVERY`` watches.

Measured over ``--window`` seconds at each fleet size: the server's CPU (``INFO cpu``,
user + sys deltas, as a share of one core), the commands it ran (``INFO commandstats``
deltas) per second and per simulated worker, and the follower checks it answered
against the ones due (a saturated server answers fewer: the figure then says so).
Then ``--deaths`` times: one registered pool process's liveness connection is closed
abruptly (what the kernel does for a SIGKILLed process), and the time until the
leader's ``Deaths.check`` reports it dead is the recovery time (its hand-off follows in
the same check).

What is *not* simulated: the rest of a worker's idle loop (heartbeats, presence, the
scheduled-task and periodic checks, the queue pops' timeouts); those cost Redis per
worker, linearly (``docs/scaling.md`` gives a real idle worker's figure beside this
table). ``--celery`` adds a modelled Celery fleet of the same size on a second
private Redis: per worker one connection looping ``BRPOP celery 1`` (kombu's Redis
transport, one queue), one subscribed to the broadcast channel, and a ``PUBLISH``
every 2 s (the worker heartbeat); a model of Celery's idle traffic, labelled so, not
a real ``celery worker``.

Targets (issue 37): at 200 workers x 8 idle, the store's Redis CPU ≤ 10 % of a core,
recovery ≤ 2 s; an idle worker ≤ 5 commands/s (here: its death checks' share).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time
from typing import Any

import redis

from bench.common import private_redis, write_result
from relier_django.core.model.config import Config
from relier_django.core.recovery import deaths
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.liveness import connection_name

SIZES = (10, 50, 200)
TARGETS = {"cpu_share_200": 0.10, "recovery_s": 2.0, "worker_cmds_s": 5.0}
PREFIX = "rl"
# A follower's check before issue 37 (the holders' SMEMBERS after these three).
ALL_LIST_CHECK = (
    ("TIME",),
    ("INFO", "server"),
    ("CLIENT", "LIST", "TYPE", "pubsub"),
    ("SMEMBERS",),
)


def _pack(*args: object) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _reply(reader: asyncio.StreamReader) -> Any:
    line = await reader.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b"-", b":"):
        return rest
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else (await reader.readexactly(size + 2))[:-2]
    if kind == b"*":
        return [await _reply(reader) for _ in range(max(0, int(rest)))]
    raise ConnectionError(f"unexpected reply {line!r}")


class Fleet:
    """The simulated fleet's sockets and loops, on one asyncio loop."""

    def __init__(self, port: int, keys: KeySpace, scheme: str) -> None:
        self.port, self.keys, self.scheme = port, keys, scheme
        self.holders: dict[str, asyncio.StreamWriter] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.checks = 0

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.holders.values():
            writer.transport.abort()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def hold(self, worker: str) -> None:
        reader, writer = await self._connect()
        writer.write(_pack("CLIENT", "SETNAME", connection_name(PREFIX, worker)))
        writer.write(_pack("SUBSCRIBE", self.keys.liveness_channel))
        await writer.drain()
        for _ in range(2):
            await _reply(reader)
        self.holders[worker] = writer
        self.tasks.append(asyncio.create_task(self._sit(reader)))

    async def _sit(self, reader: asyncio.StreamReader) -> None:
        await reader.read()  # a subscribed connection waits for nothing, until closed

    async def follower(self) -> None:
        """A follower's check before issue 37 (``all-list``), replayed: the commands
        ``Deaths.check`` sent from every scanner, replies read and dropped (parsing a
        list of 1,800 connections 800 times a second in Python would be the
        simulator's bottleneck, not the server's)."""
        reader, writer = await self._connect()
        await asyncio.sleep(random.uniform(0, deaths.CHECK_S))
        while True:
            started = time.monotonic()
            commands = [*ALL_LIST_CHECK[:3], ("SMEMBERS", self.keys.holders)]
            writer.write(b"".join(_pack(*c) for c in commands))
            await writer.drain()
            for _ in commands:
                await _reply(reader)
            self.checks += 1
            await asyncio.sleep(max(0.0, deaths.CHECK_S - (time.monotonic() - started)))

    async def celery_worker(self, i: int) -> None:
        """Celery's idle worker, modelled: BRPOP with a 1 s timeout, a subscribed
        broadcast connection, a heartbeat PUBLISH every 2 s."""
        sub_r, sub_w = await self._connect()
        sub_w.write(_pack("SUBSCRIBE", "/0.celery.pidbox"))
        await sub_w.drain()
        await _reply(sub_r)
        reader, writer = await self._connect()
        await asyncio.sleep(random.uniform(0, 1))
        last_beat = 0.0
        while True:
            if time.monotonic() - last_beat >= 2.0:
                last_beat = time.monotonic()
                writer.write(_pack("PUBLISH", "/0.celeryev/worker.heartbeat", f"beat {i}"))
                await writer.drain()
                await _reply(reader)
            writer.write(_pack("BRPOP", "celery", 1))
            await writer.drain()
            await _reply(reader)


class Followers(threading.Thread):
    """The ``leader-lists`` followers: relier's own ``Deaths.check(watch=True)``, one
    ``Deaths`` per simulated scanner, run in turn from one thread, each every WATCH_S
    (a follower that sees a live leader watches it that often)."""

    def __init__(self, client: redis.Redis, keys: KeySpace, n: int) -> None:
        super().__init__(daemon=True)
        self.views = [deaths.Deaths(client, keys) for _ in range(n)]
        self.checks = 0
        self.stop = threading.Event()

    def run(self) -> None:
        gap = deaths.WATCH_S / max(1, len(self.views))
        start = time.monotonic()
        while not self.stop.is_set():
            if time.monotonic() - start > deaths.WATCH_S:
                start = time.monotonic()  # fell behind: skip the checks missed, no burst
            for i, view in enumerate(self.views):
                due = start + i * gap
                if due > time.monotonic():
                    time.sleep(due - time.monotonic())
                view.check(watch=True)
                self.checks += 1
            start += deaths.WATCH_S


class Leader(threading.Thread):
    """relier's own death check, as the leading scanner runs it, every CHECK_S."""

    def __init__(self, client: redis.Redis, keys: KeySpace) -> None:
        super().__init__(daemon=True)
        self.deaths = deaths.Deaths(client, keys)
        self.found: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(deaths.CHECK_S):
            for worker in self.deaths.check(leading=True):
                self.found[worker] = time.monotonic()
            self.deaths.forget(list(self.found))


def _cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _calls(client: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in client.info("commandstats").values())


def _measure(client: redis.Redis, window: float) -> tuple[float, float]:
    cpu0, calls0, t0 = _cpu(client), _calls(client), time.monotonic()
    time.sleep(window)
    cpu1, calls1, t1 = _cpu(client), _calls(client), time.monotonic()
    return (cpu1 - cpu0) / (t1 - t0), (calls1 - calls0 - 2) / (t1 - t0)


def run_size(workers: int, procs: int, scheme: str, window: float, n_deaths: int,
             celery: bool) -> dict[str, Any]:  # fmt: skip
    keys = KeySpace.of(Config())
    result: dict[str, Any] = {"workers": workers, "procs": procs, "scheme": scheme}
    with private_redis() as server:
        client = redis.Redis(port=server.port, decode_responses=True)
        loop = asyncio.new_event_loop()
        fleet = Fleet(server.port, keys, scheme)
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        def on_loop(coro: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

        async def stand_up() -> None:
            for w in range(workers):
                for p in range(procs):
                    await fleet.hold(f"sim{w}@host:{p}")
                await fleet.hold(f"scanner:sim{w}@host")

        on_loop(stand_up())
        # Registered after connecting, as liveness.hold does (a subscribed connection
        # takes no SADD: the registration goes on another).
        client.sadd(keys.holders, *fleet.holders)
        client.set(keys.leader, "scanner:sim0@host", px=600_000)
        leader = Leader(redis.Redis(port=server.port, decode_responses=True), keys)
        leader.start()
        time.sleep(2 * deaths.CHECK_S)
        base_cpu, base_cmds = _measure(client, max(2.0, window / 2))  # the leader alone

        followers = None
        if scheme == "all-list":

            async def start_followers() -> None:
                for _ in range(workers - 1):
                    fleet.tasks.append(asyncio.create_task(fleet.follower()))

            on_loop(start_followers())
        else:
            followers = Followers(redis.Redis(port=server.port, decode_responses=True), keys,
                                  workers - 1)  # fmt: skip
            followers.start()

        def count() -> int:
            return fleet.checks if followers is None else followers.checks

        # Every loop running, and each follower past its first check (a full list).
        deadline = time.monotonic() + 120
        while count() < 2 * (workers - 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2 * deaths.CHECK_S)
        checks0 = count()
        cpu, cmds = _measure(client, window)
        checks = (count() - checks0) / window
        due = (workers - 1) / (deaths.CHECK_S if followers is None else deaths.WATCH_S)
        # On a loaded machine the simulator may send fewer checks than are due: the
        # server's CPU per follower check (getrusage: CPU time, not wall time, over
        # the leader's, measured alone before) then scales to the rate a real fleet
        # sends; marked when under half were sent (a thinner sample).
        kept_up = checks >= due / 2
        projected = base_cpu + (cpu - base_cpu) / checks * due if checks else float("nan")
        cmds_due = base_cmds + (cmds - base_cmds) / checks * due if checks else float("nan")
        result.update(
            connections_listed=len(client.client_list(_type="pubsub")),
            redis_cpu_share=round(cpu, 4),
            redis_cpu_share_at_due_rate=round(projected, 4),
            at_due_rate_from="measured" if kept_up else "extrapolated",
            commands_per_s=round(cmds, 1),
            commands_per_s_at_due_rate=round(cmds_due, 1),
            leader_alone_cpu_share=round(base_cpu, 4),
            follower_checks_per_s=round(checks, 1),
            follower_checks_due_per_s=round(due, 1),
        )
        result["commands_per_worker_s"] = round(result["commands_per_s_at_due_rate"] / workers, 2)
        recoveries = []
        victims = [f"sim{(i * 7 + 3) % workers}@host:{1 + i % (procs - 1)}"
                   for i in range(n_deaths)]  # fmt: skip
        for victim in victims:
            writer = fleet.holders[victim]
            closed = time.monotonic()
            loop.call_soon_threadsafe(writer.transport.abort)
            deadline = closed + 15
            while victim not in leader.found and time.monotonic() < deadline:
                time.sleep(0.01)
            recoveries.append(round(leader.found.get(victim, float("inf")) - closed, 3))
        result["recovery_s"] = recoveries
        leader.stop.set()
        leader.join(10)
        if followers is not None:
            followers.stop.set()
            followers.join(30)
        on_loop(fleet.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    if celery:
        result["celery_model"] = run_celery(workers, window)
    return result


def run_celery(workers: int, window: float) -> dict[str, Any]:
    with private_redis() as server:
        client = redis.Redis(port=server.port, decode_responses=True)
        loop = asyncio.new_event_loop()
        fleet = Fleet(server.port, KeySpace(), "celery")
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        async def start() -> None:
            for i in range(workers):
                fleet.tasks.append(asyncio.create_task(fleet.celery_worker(i)))

        asyncio.run_coroutine_threadsafe(start(), loop).result(120)
        time.sleep(3.0)
        cpu, cmds = _measure(client, window)
        asyncio.run_coroutine_threadsafe(fleet.close(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    return {"redis_cpu_share": round(cpu, 4), "commands_per_s": round(cmds, 1),
            "commands_per_worker_s": round(cmds / workers, 2)}  # fmt: skip


def real_scanners(n: int, window: float) -> dict[str, Any]:
    """``n`` of relier's own scanners (the loop every worker's main process runs), idle,
    in this process against a private Redis: the commands each costs the server per
    second, by command (``commandstats`` counts the commands inside scripts too)."""
    from bench.common import command_counts, diff_counts, setup_django

    with private_redis() as server:
        setup_django(server.url)
        from relier_django.core.model import config as config_module
        from relier_django.core.recovery.scanner import Scanner
        from testproject.celery import app

        config = config_module.current()
        client = redis.Redis(port=server.port, decode_responses=True)
        scanners = [Scanner(app, config, f"scanner:real{i}@host") for i in range(n)]
        for scanner in scanners:
            scanner.start_thread()
        time.sleep(3.0)
        before, t0 = command_counts(client), time.monotonic()
        time.sleep(window)
        spent = diff_counts(command_counts(client), before)
        elapsed = time.monotonic() - t0
        for scanner in scanners:
            scanner.stop()
        time.sleep(1.5)  # each loop sees stop() within a pass and releases its lease
    per_s = {name: round(calls / elapsed / n, 2)
             for name, calls in sorted(spent.items(), key=lambda kv: -kv[1])}  # fmt: skip
    per_s.pop("info", None)  # this function's own reads
    return {"scanners": n, "commands_per_scanner_s": round(sum(per_s.values()), 2),
            "by_command_per_scanner_s": per_s}  # fmt: skip


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'scheme':<13} {'fleet':>7} {'listed':>6} {'CPU meas.':>9} {'checks/s':>11} "
        f"{'CPU @due':>8} {'cmds/s @due':>11} {'/worker':>7} {'recovery s (worst)':>18}  "
        "Celery model: CPU, cmds/s/worker"
    ]
    for r in rows:
        worst = max(r["recovery_s"]) if r["recovery_s"] else float("nan")
        mark = "" if r["at_due_rate_from"].startswith("measured") else "*"
        celery = r.get("celery_model")
        cel = (f"{celery['redis_cpu_share']:.1%}, {celery['commands_per_worker_s']:.2f}"
               if celery else "-")  # fmt: skip
        lines.append(
            f"{r['scheme']:<13} {r['workers']:>4}x{r['procs']:<2} {r['connections_listed']:>6} "
            f"{r['redis_cpu_share']:>9.1%} "
            f"{r['follower_checks_per_s']:>5.0f}/{r['follower_checks_due_per_s']:<5.0f} "
            f"{r['redis_cpu_share_at_due_rate']:>7.1%}{mark} "
            f"{r['commands_per_s_at_due_rate']:>11.0f} "
            f"{r['commands_per_worker_s']:>7.2f} {worst:>18.2f}  {cel}"
        )
    if any(not r["at_due_rate_from"].startswith("measured") for r in rows):
        lines.append("* the simulator sent under half the checks due: the server's CPU per "
                     "check, scaled to the checks due")  # fmt: skip
    return lines


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        worst = max(r["recovery_s"]) if r["recovery_s"] else float("inf")
        tag = f"{r['scheme']} {r['workers']}x{r['procs']}"
        out.append(f"{tag}: recovery worst {worst:.2f} s (target <= {TARGETS['recovery_s']} s: "
                   f"{_verdict(worst <= TARGETS['recovery_s'])}); death checks "
                   f"{r['commands_per_worker_s']:.2f} commands/s per worker (target for the "
                   f"whole idle worker <= {TARGETS['worker_cmds_s']}: "
                   f"{_verdict(r['commands_per_worker_s'] <= TARGETS['worker_cmds_s'])})"
                   )  # fmt: skip
        if r["workers"] == 200:
            cpu = r["redis_cpu_share_at_due_rate"]
            out.append(f"{tag}: store Redis CPU at the due check rate {cpu:.1%} of a core "
                       f"(target <= {TARGETS['cpu_share_200']:.0%}: "
                       f"{_verdict(cpu <= TARGETS['cpu_share_200'])})")  # fmt: skip
    return out


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench fleet")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--scheme", choices=("all-list", "leader-lists", "both"), default="both")
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--deaths", type=int, default=3)
    parser.add_argument("--celery", action="store_true", help="add the modelled Celery fleet")
    parser.add_argument(
        "--scanners",
        type=int,
        default=3,
        help="then this many real idle scanners, their commands (0: none)",
    )
    parser.add_argument("--out", default="fleet")
    args = parser.parse_args()
    schemes = ["all-list", "leader-lists"] if args.scheme == "both" else [args.scheme]
    rows = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        for scheme in schemes:
            row = run_size(size, args.procs, scheme, args.window, args.deaths,
                           args.celery and scheme == schemes[-1])  # fmt: skip
            print(table([row])[-1], flush=True)
            rows.append(row)
    lines = table(rows) + verdicts(rows)
    data: dict[str, Any] = {"rows": rows, "targets": TARGETS}
    if args.scanners:
        real = real_scanners(args.scanners, args.window * 2)
        data["real_scanners"] = real
        spent = ", ".join(f"{k} {v}" for k, v in real["by_command_per_scanner_s"].items())
        lines.append(f"{real['scanners']} real idle scanners (one leads): "
                     f"{real['commands_per_scanner_s']} commands/s each ({spent})")  # fmt: skip
    print("\n".join(lines))
    data["table"] = lines
    write_result(args.out, data)
    return data


if __name__ == "__main__":
    main()
