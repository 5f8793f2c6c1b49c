"""Backoff: the ban policy gossip and inference routing share, on a fake clock."""

from __future__ import annotations

import pytest

from swarmd.backoff import Backoff


def test_bans_double_up_to_the_cap_and_a_sign_of_life_resets_them():
    now = [100.0]
    bans = Backoff(base_s=1.0, max_s=4.0, clock=lambda: now[0])
    assert not bans.banned("p") and bans.until("p") == float("-inf")
    assert [bans.fail("p") for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert bans.banned("p") and bans.until("p") == 104.0
    now[0] = 104.0
    assert not bans.banned("p")
    assert bans.fail("p") == 4.0  # still failing: the period stays at the cap
    bans.succeed("p")
    assert not bans.banned("p") and bans.fail("p") == 1.0
    assert not bans.banned("q")  # keys are independent


def test_bad_periods_are_refused():
    with pytest.raises(ValueError):
        Backoff(base_s=0.0)
    with pytest.raises(ValueError):
        Backoff(base_s=5.0, max_s=1.0)
