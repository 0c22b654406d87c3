"""`make demo`: push tasks, SIGKILL a worker mid-flight, count what happened, serve the admin.

Every number printed is counted from Redis after the fact: each demo task records
its own executions, and the report compares that with what was pushed.
Ctrl-C, SIGTERM, SIGHUP, an error or the normal end stop every process this script
started, and every process those started (by PID, nothing else).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testproject.harness import (  # noqa: E402
    CeleryWorker,
    RedisServer,
    wait_until,
    worker_env,
)

RUN = REPO / ".run"
# Demo-sized liveness: a dead worker's tasks come back within about TTL + scan interval.
DEMO_ENV = {"RELIER_HEARTBEAT_TTL_S": "3", "RELIER_SCAN_INTERVAL_S": "0.5"}
DEMO_PORT = 6391  # matches testproject/settings.py's default RELIER_REDIS_URL
# Signals that end the demo as Ctrl-C does: `timeout`, a supervisor, a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# How long the demo's processes get to exit on SIGTERM before they are SIGKILLed: a
# worker's warm shutdown waits for its running tasks (0.3 s each here).
STOP_DEADLINE_S = 15.0
ADMIN_USER, ADMIN_PASSWORD = "demo", "demo-password"


def say(msg: str = "") -> None:
    print(msg, flush=True)


_last_drawn: tuple[int, str] | None = None


def progress(done: int, total: int, label: str) -> None:
    global _last_drawn
    if _last_drawn == (done, label):
        return
    _last_drawn = (done, label)
    width = 40
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "-" * (width - filled)
    sys.stdout.write(f"\r  [{bar}] {done:>5}/{total} {label}   ")
    sys.stdout.flush()


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, check=True)


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwind to the clean-up, as Ctrl-C does.

    A BaseException, as KeyboardInterrupt is, so no ``except Exception`` on the way
    swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stopped_by(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).resolve()
    run_dir.mkdir(exist_ok=True)
    redis_server = RedisServer(directory=run_dir / "redis", port=args.port)
    workers: list[CeleryWorker] = []
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        say(f"relier_django demo: private Redis on 127.0.0.1:{args.port}, data in {run_dir}")
        redis_server.start()
        client = redis_server.client()
        # The demo owns this server: start each run from a clean slate.
        client.flushall()
        env = worker_env(redis_server.url, {"DATABASE_URL": f"sqlite:///{run_dir / 'db.sqlite3'}"})

        say("Migrating the SQLite database and creating the demo admin login …")
        manage(env, "migrate", "--noinput", "-v", "0")
        django_setup(env)
        ensure_admin()

        say("Starting 2 Celery workers (prefork, concurrency 2) and the resurrector …")
        for name in ("w1", "w2"):
            worker = CeleryWorker(
                redis_url=redis_server.url, log_dir=run_dir / "logs", name=name, extra_env=DEMO_ENV
            )
            # Listed before it starts: a signal while it boots must still stop it.
            workers.append(worker)
            worker.start()
        with open(run_dir / "logs" / "resurrector.log", "ab") as log:
            helpers.append(start_helper(env, ["relier_resurrector"], stdout=log))
        say(
            f"  heartbeat TTL {DEMO_ENV['RELIER_HEARTBEAT_TTL_S']} s, scan every "
            f"{DEMO_ENV['RELIER_SCAN_INTERVAL_S']} s; logs in {run_dir / 'logs'}"
        )

        receipts = push_batch(args.tasks)
        kill_mid_flight(workers[0], client, receipts)
        wait_for_quiet(client, receipts, args.settle_s)
        report(client, receipts)

        if args.no_serve:
            return 0
        server = start_helper(env, ["runserver", f"127.0.0.1:{args.http_port}", "--noreload"])
        helpers.append(server)
        url = f"http://127.0.0.1:{args.http_port}/admin/"
        say(f"\nAdmin: {url}  login {ADMIN_USER} / {ADMIN_PASSWORD}")
        say(f"Its dead-letter queue: {url}relier_django/deadletter/ (or: relier_dlq list)")
        say("Press Ctrl-C to stop every process this demo started.")
        server.wait()
        return 0
    except KeyboardInterrupt:
        say("\nStopping …")
        return 0
    except Stopped as stop:
        say(f"\n{stop}: stopping …")
        raise
    finally:
        # A second signal must not cut the clean-up short and leak what is left;
        # STOP_DEADLINE_S bounds how long it takes.
        for signum in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(signum, signal.SIG_IGN)
        stop_all(workers, helpers, redis_server)
        say("All demo processes stopped.")


def start_helper(
    env: dict[str, str], command: list[str], stdout: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """``manage.py <command>`` in a process group of its own, as the workers are, so
    stop_all can end it and anything it starts by its PID alone."""
    return subprocess.Popen(
        [sys.executable, "manage.py", *command],
        cwd=REPO,
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout else None,
        start_new_session=True,
    )


def stop_all(
    workers: list[CeleryWorker],
    helpers: list[subprocess.Popen[bytes]],
    redis_server: RedisServer,
) -> None:
    """Stop every process this demo started, and every process those started.

    SIGTERM first (a worker's warm shutdown, the resurrector's last pass), SIGKILL to
    each process group once STOP_DEADLINE_S is up; Redis last, so the workers can
    still reach it while they shut down.
    """
    # Taken before anything is signalled: a pool process whose worker dies first is
    # reparented out of this tree, and would be out of reach afterwards.
    started = psutil.Process().children(recursive=True)
    leaders = [w.process for w in workers if w.process is not None] + helpers
    deadline = time.monotonic() + STOP_DEADLINE_S
    for worker in workers:
        worker.cont_group()  # a stopped worker cannot act on SIGTERM
    for proc in leaders:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in leaders:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        worker.kill()  # SIGKILL to its group: pool processes that outlived it
    for proc in helpers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    redis_server.stop()
    # What outlived its group: a process that started a session of its own.
    left = [p for p in started if _running(p)]
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(left, timeout=10)


def _running(proc: psutil.Process) -> bool:
    # is_running() also compares the start time, so a reused PID is not taken for it.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ensure_admin() -> None:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=ADMIN_USER, defaults={"is_staff": True})
    user.is_staff = user.is_superuser = True
    user.set_password(ADMIN_PASSWORD)
    user.save()


def push_batch(count: int) -> dict[str, object]:
    """Push ``count`` relier tasks plus one poison task; returns receipts by label."""
    from testproject.demo.tasks import explode, record

    say(f"\nPushing {count} tasks (0.3 s of work each) and one task that always raises …")
    receipts: dict[str, object] = {}
    for i in range(count):
        label = f"demo-{i}"
        receipts[label] = record.push(label, 0.3)
        progress(i + 1, count, "pushed")
    receipts["poison"] = explode.push("poison")
    say()
    return receipts


def executions(client, labels) -> list[int]:
    return [int(client.llen(f"demo:exec:{label}")) for label in labels]


def outcomes(client, receipts: dict[str, object]) -> dict[str, str | None]:
    """'ok', 'failed' (in the DLQ) or None (no outcome) per label, read from Redis."""
    import json

    from relier_django.core.store.keys import KeySpace

    keys = KeySpace("rl")
    records = client.mget([keys.result(r.task_id) for r in receipts.values()])
    return {
        label: (json.loads(rec)["status"] if rec else None)
        for label, rec in zip(receipts, records, strict=True)
    }


def kill_mid_flight(worker: CeleryWorker, client, receipts: dict[str, object]) -> None:
    wait_until(lambda: sum(map(bool, executions(client, receipts))) >= 3, 60, what="tasks to start")
    say(f"SIGKILL worker {worker.name} (main process and its children) while it holds tasks …")
    worker.kill()


def wait_for_quiet(client, receipts: dict[str, object], settle_s: float) -> None:
    say("Waiting for the remaining tasks to finish …")
    last, quiet_since = -1, time.monotonic()
    while True:
        done = sum(v is not None for v in outcomes(client, receipts).values())
        progress(done, len(receipts), "with an outcome")
        if done != last:
            last, quiet_since = done, time.monotonic()
        if done == len(receipts) or time.monotonic() - quiet_since > settle_s:
            break
        time.sleep(0.2)
    say()


def records(client, receipts: dict[str, object]) -> dict[str, dict | None]:
    """Each label's outcome record as receipts read it (None: no outcome yet)."""
    import json

    from relier_django.core.store.keys import KeySpace

    keys = KeySpace("rl")
    raw = client.mget([keys.result(r.task_id) for r in receipts.values()])
    return {label: json.loads(r) if r else None for label, r in zip(receipts, raw, strict=True)}


def report(client, receipts: dict[str, object]) -> None:
    final = outcomes(client, receipts)
    runs = dict(zip(receipts, executions(client, receipts), strict=True))
    full = records(client, receipts)
    # A result carries the fence of the incarnation that committed it: above 1 means
    # the task was brought back after its worker died.
    resurrected = sum(
        1 for rec in full.values() if rec and rec["status"] == "ok" and rec["result"]["fence"] > 1
    )
    once = sum(1 for k, v in final.items() if v == "ok" and runs[k] == 1)
    dead = sum(1 for v in final.values() if v == "failed")
    lost = sum(1 for v in final.values() if v is None)
    duplicated = sum(1 for k in receipts if runs[k] > 1)
    say("\nDelivery report (counted from Redis: outcomes and each task's own execution log)")
    say(f"  pushed            {len(receipts):>6}")
    say(f"  completed once    {once:>6}")
    say(f"  in DLQ            {dead:>6}")
    say(f"  lost              {lost:>6}")
    say(f"  duplicated        {duplicated:>6}")
    say(f"  (of the completed, {resurrected} were brought back after the SIGKILL, each at a "
        "new fence)")  # fmt: skip
    poison = full.get("poison")
    if poison and poison["status"] == "failed":
        say(f"  the poison task is in the DLQ: reason {poison['reason']}, {poison['error']}")
    if lost:
        say("  (lost: tasks with no outcome when the demo stopped waiting; see docs/operations.md)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--port", type=int, default=DEMO_PORT)
    parser.add_argument("--run-dir", default=str(RUN), help="Redis data, SQLite db and logs")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument(
        "--settle-s", type=float, default=15.0, help="stop waiting after this long without progress"
    )
    parser.add_argument("--no-serve", action="store_true", help="exit after the report")
    args = parser.parse_args()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stopped_by)
    try:
        return run(args)
    except Stopped as stop:
        # Everything is stopped: now die of the signal, so that a shell or a supervisor
        # reads from the exit status how the demo ended.
        signal.signal(stop.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stop.signum)
        return 128 + stop.signum  # not reached: the default action ends the process


if __name__ == "__main__":
    raise SystemExit(main())
