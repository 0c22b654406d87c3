"""Run as a separate process by test_outbox_kill.py: one transaction that writes a
``Booking`` row and pushes ``demo.sync_record``, on the database of ``DATABASE_URL``,
with the outbox on (``RELIER_OUTBOX=1``).

``python outbox_producer.py LABEL die``: an on_commit callback registered before the
push SIGKILLs this process, so it dies after the commit and before the push's send
(Django runs on_commit callbacks in registration order). ``... LABEL send``: commits
and exits. Prints the task id (before the commit) and then the receipt, as JSON lines.
"""

import json
import os
import signal
import sys
import time

import django

django.setup()

from django.db import transaction  # noqa: E402

from testproject.demo import tasks  # noqa: E402
from testproject.demo.models import Booking  # noqa: E402

label, mode = sys.argv[1], sys.argv[2]
started = time.monotonic()
with transaction.atomic():
    Booking.objects.create(label=label, fence=0)
    if mode == "die":
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    receipt = tasks.sync_record.push(label)
    print(json.dumps({"task_id": receipt.task_id}), flush=True)
print(
    json.dumps(
        {
            "task_id": receipt.task_id,
            "state": str(receipt.dispatch_state),
            "commit_s": time.monotonic() - started,
        }
    ),
    flush=True,
)
