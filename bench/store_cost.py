"""What one task costs its Redis, by command and by script: relier_django against
vanilla Celery and Celery with acks_late, in the same run, on the same machine.

Each contender gets a fresh private Redis (broker and store on one server, as in
bench/throughput.py; with ``--broker rabbitmq`` Celery's broker is a private RabbitMQ node and
Redis holds only relier's store), one worker with 2 prefork processes and the same
no-op tasks (the delivery benchmark's work functions: one RPUSH at start, one at the
end). Over the timed span (first push to last run, after one warm-up task):

- redis-server's CPU time (user + system, from the OS), in rounds whose order flips:
  the figure that sets how many tasks per second one Redis master carries. It moves
  with the machine's load; compare contenders within a run.
- In a run of its own, every command with its calls and execution time per task, from
  the slow log set to log them all (each ``EVALSHA`` named by its script; its time
  includes the commands it called).
- In another, the requests clients sent and the commands scripts ran, from ``MONITOR``.
  That capture is then replayed, every request in order, one round trip each, to a
  redis-server under callgrind: the instructions it executes in user space per task,
  a figure of the work itself that the machine's load does not move (the kernel's
  share, about half of the CPU time, grows with the requests and is not in it). For
  relier_django each script's calls are also replayed apart, in a task's order (every
  push, then every take, registration, start and commit), each by the current source of its
  ``.lua`` file: ``--keep-capture`` and ``--replay`` measure an edited script without
  a worker.

    python -m bench.store_cost [--tasks 2000] [--rounds 2] [--broker rabbitmq]
    python -m bench.store_cost --replay FILE [--instructions]

Other sizes than the defaults write ``store_cost-small.json`` (``-rabbitmq`` too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from bench.common import (
    AS_SHIPPED,
    private_rabbitmq,
    private_redis,
    producer_on,
    rabbitmq_env,
    setup_django,
    write_result,
)
from testproject.rabbitmq import RabbitServer

CONTENDERS = ("vanilla", "acks_late", "relier")
DEFAULTS = {"tasks": 2000, "rounds": 2}
SLOWLOG_MAX = 1_000_000
# The benchmark's own polling (bench/throughput.py's _wait_done) and the work functions'
# records: the same for every contender, shown apart from the task's path.
# The order of a task's life, in which a replay sends each script's captured calls.
LIFECYCLE = ("push", "take", "heartbeat", "start", "commit")
HARNESS = {"LLEN", "SLOWLOG", "CONFIG", "INFO", "PING", "CLIENT"}


def _script_names() -> dict[str, str]:
    from relier_django.core.store import scripts

    found: dict[str, str] = {}
    for value in vars(scripts).values():
        if isinstance(value, scripts.LuaScript):
            found[value.sha] = value.name
    return found


def _entries(client: Any) -> list[tuple[str, int]]:
    """Every command the slow log holds, oldest first: (name, microseconds)."""
    names = _script_names()
    found = []
    for entry in client.slowlog_get(SLOWLOG_MAX):
        command = entry["command"]
        words = command.split() if isinstance(command, str) else command.decode().split()
        name = words[0].upper() if words else "?"
        if name in ("EVALSHA", "EVAL") and len(words) > 1:
            name = f"{name.lower()} {names.get(words[1], words[1][:8])}"
        found.append((name, int(entry["duration"])))
    return list(reversed(found))


def _requests(path: Path) -> tuple[Counter[str], Counter[str]]:
    """From a MONITOR capture: the requests clients sent and the commands scripts ran,
    by name (each ``EVALSHA`` by its script's)."""
    names = _script_names()
    sent: Counter[str] = Counter()
    nested: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        _, _, rest = line.partition(" [")
        source, _, words = rest.partition("] ")
        parts = [w.strip('"') for w in words.split(" ", 2)]
        name = parts[0].upper()
        if name in ("EVALSHA", "EVAL") and len(parts) > 1:
            name = f"{name.lower()} {names.get(parts[1], parts[1][:8])}"
        if name:
            (nested if source.endswith(" lua") else sent)[name] += 1
    return sent, nested


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def _unquote(text: str) -> bytes:
    """One argument as MONITOR printed it (sdscatrepr's escapes), back to its bytes."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "x":
                out.append(int(text[i + 2 : i + 4], 16))
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt.encode())
            i += 2
            continue
        out += ch.encode()
        i += 1
    return bytes(out)


def _names_file(capture: Path) -> Path:
    # Beside a kept capture: its scripts' names by SHA, as they were when it was taken,
    # so that a replay of edited scripts still knows which call was which.
    return capture.with_name(capture.name + ".scripts.json")


def _sent(path: Path) -> Iterator[list[bytes]]:
    """From a MONITOR capture: each request a client sent (not what scripts ran), as
    its arguments, in the order the server executed them."""
    for line in path.read_text(errors="replace").splitlines():
        _, _, rest = line.partition(" [")
        source, _, words = rest.partition("] ")
        if words and not source.endswith(" lua"):
            yield [_unquote(m) for m in _QUOTED.findall(words)]


def _capture_names(path: Path) -> dict[str, str]:
    names = _script_names()
    if _names_file(path).exists():
        names.update(json.loads(_names_file(path).read_text()))
    return names


def script_calls(path: Path) -> dict[str, list[list[bytes]]]:
    """From a MONITOR capture: every script call a client sent, by script name, in the
    order sent; each as its EVALSHA arguments after the SHA (numkeys, keys, args)."""
    names = _capture_names(path)
    found: dict[str, list[list[bytes]]] = {}
    for args in _sent(path):
        if args[0].upper() == b"EVALSHA" and (name := names.get(args[1].decode(), "")):
            found.setdefault(name, []).append(args[2:])
    return found


def _server_cpu_s(client: Any) -> float:
    # Redis's own getrusage(), to the microsecond (the OS's per-process figure that
    # psutil reads moves in 10 ms ticks: too coarse for a few thousand calls).
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _instructions(pid: int) -> int:
    """The instructions callgrind has counted so far in ``pid``, every thread."""
    out = subprocess.run(
        ["callgrind_control", "-e", "Ir", str(pid)], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(m.replace(",", "")) for m in re.findall(r"^\s+Th \d+\s+([\d,]+)", out, re.M))


@contextlib.contextmanager
def _callgrind_redis(directory: Path) -> Iterator[tuple[Any, int]]:
    """A redis-server (AOF on, as the private servers run) under callgrind, which counts
    the instructions it executes: the same figure for the same work whatever else the
    machine does, where CPU time on this shared machine moves by a factor of two."""
    import redis

    from testproject.harness import free_port

    port = free_port()
    process = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={directory}/callgrind.out",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server under callgrind did not start") from None
                time.sleep(0.2)
        yield client, process.pid
    finally:
        process.kill()
        process.wait(30)


def replay(path: Path, instructions: bool = False) -> dict[str, dict[str, float]]:
    """Each script's cost per call: the captured calls sent again, one round trip each
    as a worker sends them, to a fresh private Redis, script by script in a task's
    order (every push, then every registration, start and commit), each script by the
    *current* source of its ``.lua`` file (an edited script is measured without a
    worker). The cost is redis-server's CPU time, or with ``instructions`` the
    instructions it executed in user space (under callgrind: repeatable)."""
    from relier_django.core.store import scripts

    sources = {v.name: v for v in vars(scripts).values() if isinstance(v, scripts.LuaScript)}
    calls = script_calls(path)
    order = [*(n for n in LIFECYCLE if n in calls), *(n for n in calls if n not in LIFECYCLE)]
    found: dict[str, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        if instructions:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relier-cg-")))
            client, pid = stack.enter_context(_callgrind_redis(tmp))
            measure, unit = (lambda: _instructions(pid)), "instructions_per_call"
        else:
            client = stack.enter_context(private_redis()).client()
            measure, unit = (lambda: _server_cpu_s(client) * 1e6), "cpu_us_per_call"
        for name in order:
            sha = client.script_load(sources[name].source)
            before = measure()
            for args in calls[name]:
                client.execute_command("EVALSHA", sha, *args)
            spent = measure() - before
            found[name] = {"calls": len(calls[name]), unit: round(spent / len(calls[name]), 1)}
    return found


# Requests a replay leaves out: the benchmark's own, and those that would change the
# replaying connection's mode (pub/sub: the liveness connections) or its database.
NOT_REPLAYED = {*HARNESS, "MONITOR", "SUBSCRIBE", "UNSUBSCRIBE", "PSUBSCRIBE", "PUNSUBSCRIBE",
                "SELECT", "AUTH", "HELLO", "QUIT", "RESET"}  # fmt: skip


def replay_all(path: Path, tasks: int) -> float:
    """The instructions redis-server executes per task for every request of a capture,
    sent again in order, one round trip each, under callgrind: a figure of the work
    itself, for any contender, that the machine's load does not move. A blocking pop
    waits a millisecond at most (in the run it waited for work to arrive); a script
    runs by its current source."""
    from relier_django.core.store import scripts

    names = _capture_names(path)
    sources = {v.name: v for v in vars(scripts).values() if isinstance(v, scripts.LuaScript)}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="relier-cg-"))
        client, pid = stack.enter_context(_callgrind_redis(Path(tmp)))
        current = {sha: client.script_load(sources[name].source)
                   for sha, name in names.items() if name in sources}  # fmt: skip
        before = _instructions(pid)
        for args in _sent(path):
            name = args[0].upper().decode()
            if name in NOT_REPLAYED:
                continue
            if name in ("BRPOP", "BLPOP", "BZPOPMIN", "BLMOVE"):
                args = [*args[:-1], b"0.001"]
            elif name == "EVALSHA":
                args = [args[0], current.get(args[1].decode(), args[1].decode()).encode(),
                        *args[2:]]  # fmt: skip
            # A request replayed out of its time may be refused (a lease long gone): the
            # server did the work of refusing it, as it would have of running it.
            with contextlib.suppress(redis.ResponseError):
                client.execute_command(*args)
        return (_instructions(pid) - before) / tasks


def run(
    contender: str, n: int, log_dir: Path, mode: str = "cpu", broker: RabbitServer | None = None
) -> dict[str, Any]:
    """One run of ``n`` no-op tasks: the redis-server CPU per task (``cpu``), each
    command's calls and execution time per task (``slowlog``), or the requests sent
    and the commands scripts ran, per task (``monitor``).

    ``broker``: a RabbitMQ node for Celery's broker (quorum queues, one queue per run,
    as the other benchmarks' RabbitMQ rounds); Redis then holds only relier's store
    (and the work functions' records)."""
    from bench.delivery import _point_at, push_all
    from bench.throughput import CONTENDERS as TASKS
    from bench.throughput import _cpu_s, _wait_done
    from testproject.harness import CeleryWorker

    task, extra = TASKS[contender]
    extra = {**extra, **AS_SHIPPED}
    if broker is not None:
        extra = rabbitmq_env(broker, f"store-cost-{contender}-{mode}", extra)
    labels = [f"{contender}-{i}" for i in range(n)]
    capture = log_dir / f"monitor-{contender}.txt"
    with private_redis() as server, contextlib.ExitStack() as stack:
        setup_django(server.url)
        _point_at(server.url)
        if broker is not None:
            stack.enter_context(producer_on(extra))
        client = server.client(decode_responses=True)
        worker = CeleryWorker(server.url, log_dir, name=f"sc-{contender}", extra_env=extra)
        worker.start()
        monitor = None
        try:
            push_all(contender, task, labels[:1], 0.0)  # warm both ends
            _wait_done(client, labels[:1], 60)
            if mode == "slowlog":
                client.config_set("slowlog-max-len", SLOWLOG_MAX)
                client.config_set("slowlog-log-slower-than", 0)
                client.slowlog_reset()
            elif mode == "monitor":
                with capture.open("w") as out:
                    monitor = subprocess.Popen(
                        ["redis-cli", "-p", str(server.port), "monitor"],
                        stdout=out, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                time.sleep(0.5)  # subscribed before the first push
            before = _cpu_s([server.pid])
            push_all(contender, task, labels[1:], 0.0)
            _wait_done(client, labels[1:], 600)
            cpu_ms = (_cpu_s([server.pid]) - before) * 1000 / (n - 1)
            if mode == "slowlog":
                client.config_set("slowlog-log-slower-than", -1)
                entries = _entries(client)
        finally:
            if monitor is not None:
                monitor.terminate()
                monitor.wait(10)
            worker.stop()
    per_task = n - 1
    if mode == "slowlog":
        calls: Counter[str] = Counter()
        usec: Counter[str] = Counter()
        for name, duration in entries:
            if name not in HARNESS:
                calls[name] += 1
                usec[name] += duration
        return {name: {"calls": round(calls[name] / per_task, 3),
                       "exec_us": round(usec[name] / per_task, 2)}
                for name, _ in usec.most_common()}  # fmt: skip
    if mode == "monitor":
        sent, nested = _requests(capture)
        return {
            "sent": {k: round(v / per_task, 3) for k, v in sent.most_common()
                     if k not in HARNESS and k != "MONITOR"},
            "in_scripts": {k: round(v / per_task, 3) for k, v in nested.most_common()},
        }  # fmt: skip
    return {"redis_cpu_ms_per_task": round(cpu_ms, 4)}


def _print(contender: str, cpu_ms: float, detail: dict[str, Any]) -> None:
    timed, sent = detail["slowlog"], detail["monitor"]["sent"]
    scripted = detail["monitor"]["in_scripts"]
    print(f"\n{contender}: redis CPU {cpu_ms * 1000:.0f} us per task, "
          f"{sum(sent.values()):.1f} requests per task, "
          f"{detail['instructions_per_task']:,} instructions per task (replayed)")  # fmt: skip
    print(f"  {'command':<22} {'sent':>6} {'in scripts':>10} {'exec us':>8}")
    for name in dict.fromkeys([*sent, *scripted]):
        if sent.get(name, 0) + scripted.get(name, 0) < 0.01:
            continue
        exec_us = timed.get(name, {}).get("exec_us", 0.0)
        print(f"  {name:<22} {sent.get(name, 0):6.2f} {scripted.get(name, 0):10.2f} "
              f"{exec_us:8.1f}")  # fmt: skip


def _print_replay(found: dict[str, dict[str, float]]) -> None:
    print("\nrelier_django's scripts replayed, one round trip each (cost per call):")
    for name, cost in found.items():
        if "instructions_per_call" in cost:
            figure = f"{cost['instructions_per_call']:9.0f} instructions"
        else:
            figure = f"{cost['cpu_us_per_call']:7.1f} us"
        print(f"  {name:<12} {figure}  ({cost['calls']} calls)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=DEFAULTS["tasks"])
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"])
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, help="run only these")
    parser.add_argument(
        "--broker", choices=("redis", "rabbitmq"), default="redis",
        help="rabbitmq: Celery's broker on a private RabbitMQ node, Redis holds only the store",
    )  # fmt: skip
    parser.add_argument(
        "--keep-capture", type=Path, metavar="FILE",
        help="keep relier_django's MONITOR capture (for --replay)",
    )  # fmt: skip
    parser.add_argument(
        "--replay", type=Path, metavar="FILE",
        help="only replay a kept capture with the current scripts and print each one's cost",
    )  # fmt: skip
    parser.add_argument(
        "--instructions", action="store_true",
        help="with --replay: count instructions under callgrind instead of CPU time",
    )  # fmt: skip
    args = parser.parse_args()
    if args.replay:
        setup_django("redis://127.0.0.1:1/0")  # the scripts' module; no server is used
        _print_replay(replay(args.replay, args.instructions))
        return
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(private_rabbitmq()) if args.broker == "rabbitmq" else None
        _main(args, broker)


def _main(args: argparse.Namespace, broker: RabbitServer | None) -> None:
    chosen = args.only or list(CONTENDERS)
    cpu: dict[str, list[float]] = {c: [] for c in chosen}
    details: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="relier-store-cost-") as tmp:
        for round_ in range(args.rounds):
            for contender in chosen if round_ % 2 == 0 else reversed(chosen):
                found = run(contender, args.tasks, Path(tmp), broker=broker)
                cpu[contender].append(found["redis_cpu_ms_per_task"])
                us = found["redis_cpu_ms_per_task"] * 1000
                print(
                    f"round {round_ + 1} {contender:<10} redis CPU {us:6.0f} us per task",
                    flush=True,
                )
        for contender in chosen:
            details[contender] = {
                mode: run(contender, args.tasks, Path(tmp), mode, broker)
                for mode in ("slowlog", "monitor")
            }
        for contender in chosen:
            capture = Path(tmp) / f"monitor-{contender}.txt"
            details[contender]["instructions_per_task"] = round(replay_all(capture, args.tasks - 1))
        if "relier" in chosen:
            capture = Path(tmp) / "monitor-relier.txt"
            details["relier"]["replay"] = replay(capture, instructions=True)
            if args.keep_capture:
                shutil.copy(capture, args.keep_capture)
                _names_file(args.keep_capture).write_text(json.dumps(_script_names()))
    medians = {c: round(statistics.median(v), 4) for c, v in cpu.items()}
    for contender in chosen:
        _print(contender, medians[contender], details[contender])
    if "replay" in details.get("relier", {}):
        _print_replay(details["relier"]["replay"])
    ratios: dict[str, dict[str, float]] = {}
    if "relier" in medians:
        for other in ("vanilla", "acks_late"):
            if medians.get(other):
                cpu_ratio = medians["relier"] / medians[other]
                work_ratio = (details["relier"]["instructions_per_task"]
                              / details[other]["instructions_per_task"])  # fmt: skip
                ratios[other] = {"cpu": round(cpu_ratio, 3), "instructions": round(work_ratio, 3)}
                print(f"\nrelier_django / {other}: {cpu_ratio:.2f} x redis CPU per task, "
                      f"{work_ratio:.2f} x instructions per task")  # fmt: skip
    sized = args.tasks == DEFAULTS["tasks"] and args.rounds == DEFAULTS["rounds"]
    name = "store_cost-rabbitmq" if broker is not None else "store_cost"
    path = write_result(
        name if sized else f"{name}-small",
        {"broker": "rabbitmq" if broker is not None else "redis", "tasks": args.tasks,
         "rounds": args.rounds, "cpu_ms_per_task": cpu, "median_cpu_ms_per_task": medians,
         "relier_over": ratios, "detail": details},
    )  # fmt: skip
    print(f"\nwritten: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    main()
