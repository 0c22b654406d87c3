"""Run as a separate process by the idempotency test: push one idempotent call at a
given wall-clock instant, wait for the result, print it as JSON."""

import json
import sys
import time

import django

django.setup()

from testproject.demo import tasks  # noqa: E402

start_at, order_id = float(sys.argv[1]), sys.argv[2]
while time.time() < start_at:
    time.sleep(0.0005)
receipt = tasks.charge.push(order_id, 100, 0.5)
result = receipt.get(timeout=60)
print(json.dumps({"task_id": receipt.task_id, "dedup": receipt.deduplicated, "result": result}))
