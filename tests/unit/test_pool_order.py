"""worker/pool_order.py: a message from the recovery queue joins the head of the worker's
wait for a free pool process; the others keep their order. The real thing (a prefork
worker with a prefetched backlog) is tests/chaos/test_process_death.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kombu.asynchronous.semaphore import LaxBoundedSemaphore

from relier_django.core.worker import pool_order

pytestmark = pytest.mark.unit

RECOVERY = "relier.recovery"


def _request(task_id: str, queue: str = "celery") -> SimpleNamespace:
    return SimpleNamespace(id=task_id, delivery_info={"routing_key": queue})


def test_a_recovered_message_waits_at_the_head_and_the_rest_keep_their_order():
    ran: list[str] = []
    controller = SimpleNamespace(semaphore=LaxBoundedSemaphore(1))
    assert pool_order.install(controller, RECOVERY)
    assert pool_order.install(controller, RECOVERY)  # idempotent: wrapped once

    def process(request: SimpleNamespace) -> None:
        ran.append(request.id)

    for request in [_request("a"), _request("b"), _request("c"), _request("r", RECOVERY)]:
        controller.semaphore.acquire(process, request)  # as Celery's _process_task_sem
    controller.semaphore.acquire(process, _request("d"))
    for _ in range(4):
        controller.semaphore.release()  # a pool process became free
    assert ran == ["a", "r", "b", "c", "d"]


def test_a_worker_without_the_wait_is_left_alone():
    assert not pool_order.install(SimpleNamespace(semaphore=None), RECOVERY)
    assert not pool_order.install(None, RECOVERY)


def test_the_recovery_queue_is_told_by_the_routing_key():
    assert pool_order.from_recovery(_request("r", RECOVERY), RECOVERY)
    assert not pool_order.from_recovery(SimpleNamespace(delivery_info={}), RECOVERY)
    assert not pool_order.from_recovery(SimpleNamespace(), RECOVERY)


def test_recovered_messages_keep_their_order_among_themselves_at_the_head():
    ran: list[str] = []
    controller = SimpleNamespace(semaphore=LaxBoundedSemaphore(1))
    pool_order.install(controller, RECOVERY)

    def process(request: SimpleNamespace) -> None:
        ran.append(request.id)

    for request in [_request("a"), _request("b"), _request("r1", RECOVERY), _request("c"),
                    _request("r2", RECOVERY)]:  # fmt: skip
        controller.semaphore.acquire(process, request)
    for _ in range(4):
        controller.semaphore.release()
    assert ran == ["a", "r1", "r2", "b", "c"]
