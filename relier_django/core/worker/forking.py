"""What a worker's pool processes share with its main process: the objects the main
process holds as it starts, frozen out of the garbage collector's reach before the
pool's first fork.

A prefork pool process starts as a copy-on-write image of the main process: a page
stays shared until either side writes to it. CPython's cyclic garbage collector writes
to every object it examines (the links of its generation lists), and Celery's prefork
pool runs a full collection in the main process before forking each pool process
(``AsynPool._create_worker_process``, Celery issue #2927). The collection before the
second fork copies, in the main process, every page the first pool process shares with
it, and leaves the first pool process the only holder of the originals; any later full
collection, in the main process or in a pool process, does the same. Measured on an
idle worker of two pool processes (``bench/worker_memory.py``): the first held 39.7 MiB
of its own, the second 13.5.

``gc.freeze()`` moves every object the collector tracks into a permanent generation no
collection examines, which is what CPython's documentation advises for a process that
forks without exec (gunicorn users do it in ``pre_fork``). Done once per process, just
before the pool's first fork (Celery's ``worker_before_create_process``) and after a
collection of its own, so no garbage is frozen: what the main process built as it
started (Django, Celery, the task modules, relier's config) then stays shared with every
pool process. The price: an object of that moment that later becomes garbage inside a
reference cycle is never freed (reference counting still frees every other one). Only
once, because a later fork (a pool process replaced after ``max_tasks_per_child`` or a
death) would freeze the main process's work in flight at that moment, a leak per fork.
"""

from __future__ import annotations

import gc
from typing import Any

_frozen = False


def freeze_before_first_fork(**_: Any) -> None:
    """Celery's ``worker_before_create_process`` (in the main process, before each fork
    of a prefork pool process): collect, then freeze, the first time only."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
