"""bench/fleet.py measures what it says: a small fleet on its own private Redis, every
simulated connection listed, each scheme's follower checks sent, and a closed liveness
connection found dead by relier's own leader check (no timing asserted)."""

from __future__ import annotations

import pytest

from bench import fleet

pytestmark = pytest.mark.tooling


@pytest.mark.parametrize("scheme", ["all-list", "leader-lists"])
def test_a_small_fleet_is_stood_up_measured_and_its_death_found(scheme: str):
    row = fleet.run_size(3, 2, scheme, window=1.0, n_deaths=1, celery=False)
    assert row["connections_listed"] == 3 * (2 + 1)  # each process and each scanner
    assert row["follower_checks_per_s"] > 0 and row["commands_per_s"] > 0
    assert len(row["recovery_s"]) == 1 and row["recovery_s"][0] < float("inf")
    assert row["recovery_s"][0] >= 1.0  # the grace (deaths.GRACE_S) was kept
    assert fleet.table([row])[1].startswith(scheme)
