"""``python -m relier_django.crashpoints.launch <directory> <celery arguments>``: a
Celery worker whose processes record every crash point they cross in ``directory``
and die at the armed one (``hook.py``). The hook is installed in the main process,
before Celery forks its pool, so every pool process, replacements included, has it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..core import crashpoint
from .hook import Recorder


def main(argv: list[str] | None = None) -> None:
    """Install the recorder for ``argv[0]`` (a directory), then run ``celery argv[1:]``."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m relier_django.crashpoints.launch DIR CELERY_ARGS...")
    crashpoint.install(Recorder(Path(args[0])))
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *args[1:]]
    celery_main()


if __name__ == "__main__":
    main()
