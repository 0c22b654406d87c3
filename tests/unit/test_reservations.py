"""Which Celery messages are @rl_task envelopes (and so get reserved-task coverage)."""

from __future__ import annotations

from relier_django.core.model.envelope import Envelope
from relier_django.core.worker.reservations import fence_of


def test_one_envelope_argument_gives_its_fence():
    assert fence_of([Envelope(id="t", task="x", fence=4).encode()]) == 4
    assert fence_of((Envelope(id="t", task="x").encode(),)) == 1


def test_anything_else_is_not_an_envelope():
    envelope = Envelope(id="t", task="x").encode()
    for args in (
        None,
        [],
        ["label", 0.5],
        [envelope, envelope],
        [42],
        ['{"sha256": 1'],
        ['["sha256"]'],
    ):
        assert fence_of(args) is None, args
