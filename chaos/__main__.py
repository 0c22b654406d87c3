"""``python -m chaos list`` | ``python -m chaos run <scenario>|all [options]``.

Exit status: 0 when every scenario run held every invariant, 1 when one failed (or the
run itself broke), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from .runner import FULL_TASKS, SMALL_TASKS, Options
from .scenarios import SCENARIOS

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _tasks(text: str) -> int:
    named = {"small": SMALL_TASKS, "full": FULL_TASKS}
    if text in named:
        return named[text]
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, 'small' or 'full'") from None
    if value < 5:
        raise argparse.ArgumentTypeError("--tasks must be at least 5")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m chaos", description="Real faults against relier_django, with invariants."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the scenarios, one line each")
    run = sub.add_parser("run", help="run a scenario, or all of them")
    run.add_argument("scenario", choices=[*SCENARIOS, "all"], metavar="SCENARIO|all")
    run.add_argument(
        "--tasks", type=_tasks, default=FULL_TASKS,
        help=f"workload size: a number, 'small' ({SMALL_TASKS}) or 'full' ({FULL_TASKS}, default)",
    )  # fmt: skip
    run.add_argument("--workers", type=int, default=2, help="worker slots (default 2)")
    run.add_argument("--seed", type=int, default=7, help="seed of every random choice")
    run.add_argument("--keep", action="store_true", help="keep logs and data even on success")
    run.add_argument("--json", type=Path, help="also write the reports to this file")
    return parser


def _list() -> int:
    width = max(len(name) for name in SCENARIOS)
    for name, scenario in SCENARIOS.items():
        print(f"{name:<{width}}  {scenario.summary}")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        print("--workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    opts = Options(tasks=args.tasks, workers=args.workers, seed=args.seed, keep=args.keep)
    results: list[tuple[str, str, float]] = []
    reports = []
    for name in names:
        scenario = SCENARIOS[name]
        print(f"== {name}: running ({opts.tasks} tasks, {opts.workers} workers, seed {opts.seed})")
        began = time.monotonic()
        report = scenario.run(opts)
        print(report.render() + "\n", flush=True)
        reports.append(report.to_json())
        results.append((name, "PASS" if report.ok else "FAIL", time.monotonic() - began))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2) + "\n")
    if len(names) > 1:
        print("summary:")
        for name, verdict, seconds in results:
            print(f"  {verdict:<11} {name:<18} {seconds:6.1f} s")
    return EXIT_FAILED if any(v == "FAIL" for _, v, _ in results) else EXIT_OK


class _Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind through every ``finally`` (each cluster stops its
    processes by PID), as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signal(signum: int, _frame: object) -> None:
    raise _Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGHUP, _stop_on_signal)
    args = _parser().parse_args(argv)
    if args.command == "list":
        return _list()
    try:
        return _run(args)
    except (KeyboardInterrupt, _Interrupted) as exc:
        signum = exc.signum if isinstance(exc, _Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        print(f"{name}: stopped every process this run started", file=sys.stderr, flush=True)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
