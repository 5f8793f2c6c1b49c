"""DeadlinePolicy's participation-target rule (issue 11): the deadline the simulator found to beat lockstep on WAN."""

from __future__ import annotations

import pytest

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.deadline import DeadlinePolicy

CFG = GossipConfig(deadline_min_s=1.0, deadline_max_s=30.0)


def test_target_rule_waits_for_the_target_fraction_of_expected_deltas():
    policy = DeadlinePolicy(CFG, target=0.75)
    assert policy.deadline_s() == 30.0  # nothing measured: the upper bound
    policy.observe_arrivals([2.0, 3.0, 4.0, 10.0], missing=0, closed_s=10.0)
    # 3 of 4 expected = the 3rd arrival, 4 s after open; own delta ready 1 s after open -> wait 3 s
    assert policy.deadline_s(ready_after_open_s=1.0) == pytest.approx(3.0)
    assert policy.deadline_s(ready_after_open_s=3.5) == 1.0  # never below deadline_min_s after ready


def test_missing_deltas_count_as_later_than_every_arrival_and_the_deadline_grows():
    policy = DeadlinePolicy(CFG, target=0.75, growth=1.5)
    policy.observe_arrivals([2.0, 3.0], missing=2, closed_s=4.0)  # half arrived by the close at 4 s
    assert policy.target_after_open_s() == pytest.approx(6.0)  # 1.5 x the close: participation was short
    policy.observe_arrivals([2.0, 2.5, 3.0, 3.5], missing=0, closed_s=3.5)
    # 8 expected over the window, 6 arrived: the 6th (= ceil(0.75 x 8)) is the last arrival, 3.5 s
    assert policy.target_after_open_s() == pytest.approx(3.5)
    assert policy.deadline_s(ready_after_open_s=0.5) == pytest.approx(3.0)


def test_window_forgets_old_rounds_and_the_bounds_hold():
    policy = DeadlinePolicy(CFG, target=0.5, window=2)
    policy.observe_arrivals([100.0, 100.0], missing=0, closed_s=100.0)
    assert policy.deadline_s() == 30.0  # clipped to deadline_max_s
    policy.observe_arrivals([1.0, 1.0], missing=0, closed_s=1.0)
    policy.observe_arrivals([2.0, 2.0], missing=0, closed_s=2.0)
    assert policy.target_after_open_s() == pytest.approx(1.0)  # the 100 s round left the window
    policy.observe_arrivals([], missing=0, closed_s=5.0)  # a round that expected nobody changes nothing
    assert policy.target_after_open_s() == pytest.approx(1.0)


def test_target_zero_keeps_the_ema_rule_and_bad_arguments_are_refused():
    ema = DeadlinePolicy(CFG, target=0.0)
    ema.observe_arrivals([5.0], missing=3, closed_s=5.0)  # ignored by the EMA rule
    assert ema.target_after_open_s() is None
    assert ema.deadline_s() == 30.0
    ema.observe(2.0)
    assert ema.deadline_s() == pytest.approx(6.0)  # factor 3 x EMA 2 s
    for bad in ({"target": 1.5}, {"window": 0}, {"growth": 0.5}):
        with pytest.raises(ValueError):
            DeadlinePolicy(CFG, **bad)


def test_a_round_whose_target_needs_every_delta_waits_like_the_ema_rule():
    policy = DeadlinePolicy(CFG, target=0.8)
    policy.observe(2.0, round_s=6.0)
    policy.observe_arrivals([2.0, 3.0, 4.0, 5.0, 6.0], missing=0, closed_s=6.0)
    assert policy.target_after_open_s(expected=6) == pytest.approx(
        5.0
    )  # the 4th of the 5 seen (6 expected now: one may be left out)
    assert policy.target_after_open_s(expected=4) is None  # ceil(0.8 x 4) = 4: every delta is needed
    assert policy.deadline_s(1.0, expected=4) == pytest.approx(8.0)  # the EMA rule: 1.5 x 6 - 1
    assert policy.deadline_s(1.0, expected=6) == pytest.approx(4.0)


def test_the_daemon_uses_the_participation_target_by_default():
    from swarmd.averaging.deadline import PARTICIPATION_TARGET

    assert PARTICIPATION_TARGET == 0.8  # the simulator's pick over the EMA rule (benchmarks/async_sim.py)
    assert DeadlinePolicy(GossipConfig()).target == PARTICIPATION_TARGET


def test_the_cap_follows_a_long_round_and_an_idle_round_waits_for_the_round_length_seen():
    """A later block's round is longer (trajectory training runs its predecessors): the cap is deadline_max_s or
    1.5 x the round's own training time, whichever is longer; an idle round waits up to that cap for the round
    length measured so far, at least 2 x deadline_max_s, longer after it missed a trainer (the copy task's
    sequential swarm: block 0's idle peer closed at 30 s while block 1 trained 35 s rounds)."""
    policy = DeadlinePolicy(CFG, target=0.8)
    assert policy.cap_s(4.0) == 30.0 and policy.cap_s(40.0) == pytest.approx(60.0)
    assert policy.deadline_s(ready_after_open_s=40.0) == pytest.approx(60.0)  # nothing measured: the cap
    policy.observe(30.0, round_s=70.0)  # the slowest peer came 70 s after open
    assert policy.deadline_s(ready_after_open_s=40.0, expected=3) == pytest.approx(60.0)  # 1.5 x 70 - 40, capped
    assert policy.deadline_s(ready_after_open_s=4.0, expected=3) == 30.0  # a short round keeps deadline_max_s
    assert policy.idle_deadline_s() == pytest.approx(105.0)
    fresh = DeadlinePolicy(CFG)
    assert fresh.idle_deadline_s() == 60.0  # at least 2 x deadline_max_s: waiting costs an idle peer nothing
    for grown in (90.0, 135.0):  # an idle round that missed a trainer's delta: the next waits 1.5 x longer
        fresh.observe_idle(missing=1)
        assert fresh.idle_deadline_s() == pytest.approx(grown)
    for _ in range(10):
        fresh.observe_idle(missing=1)
    assert fresh.idle_deadline_s() == pytest.approx(60.0 * 1.5**4)  # bounded
    fresh.observe_idle(missing=0)  # every trainer came: back to the floor
    assert fresh.idle_deadline_s() == 60.0
    for trained_s in (45.0, 30.0):  # a round it trained itself: another block's rounds run longer, up to ~2x at B=4
        fresh.observe_training(trained_s)
    assert fresh.idle_deadline_s() == pytest.approx(3 * 45.0)  # the longest own round of the window, x3
    for _ in range(10):
        fresh.observe_idle(missing=1)
    assert fresh.idle_deadline_s() == pytest.approx(60.0 * 1.5**4)  # only the floor grows: never 5 x 135 s
