"""Balanced rounds (swarmd.core.balanced_rounds): how many steps a peer takes a round, from the rates the records
announce, within [H, cap x H]; and the daemon's use of it (swarmd.node.rounds.balanced_steps)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest
from swarm_utils import daemon_config, link_static, running

from swarmd.averaging.config import GossipConfig
from swarmd.core.balanced_rounds import round_steps, slowest_rate
from swarmd.errors import ConfigError
from swarmd.node.rounds import balanced_steps
from swarmd.sim.costs import StepCosts


def test_a_faster_peer_takes_the_steps_the_slowest_takes_h_in_within_h_and_cap_h():
    assert round_steps(20, 30.0, 20.0, 2.0) == 30  # 1.5x the rate: 1.5x the steps
    assert round_steps(20, 100.0, 20.0, 2.0) == 40  # capped at 2 H: what a lying slow rate can cost
    assert round_steps(20, 10.0, 20.0, 2.0) == 20  # the slowest itself (or slower): H, never fewer
    assert round_steps(20, 29.0, 20.0, 2.0) == 29  # rounded down: it never outlasts the slowest
    assert round_steps(25, 1 / 0.0156, 1 / 0.0225, 2.0) == 36


@pytest.mark.parametrize(("own", "slowest", "cap"), [(30.0, 20.0, 1.0), (0.0, 20.0, 2.0), (30.0, 0.0, 2.0)])
def test_balancing_off_or_a_rate_unknown_gives_h(own, slowest, cap):
    assert round_steps(20, own, slowest, cap) == 20


def test_the_slowest_rate_ignores_unknown_and_nonsense_rates():
    assert slowest_rate([0.0, float("nan"), float("inf"), -3.0, 12.0, 40.0]) == 12.0
    assert slowest_rate([0.0]) == 0.0


def test_a_step_cost_model_balances_its_blocks_like_daemons_do():
    costs = StepCosts((0.0156, 0.0216, 0.0225, 0.0215), 0.0355, 1, 1, 1)
    assert costs.balanced_steps(25, 2.0) == (36, 26, 25, 26)
    assert costs.balanced_steps(25, 1.0) == (25,) * 4


def _peer(rate: float, me: str = "me") -> SimpleNamespace:
    return SimpleNamespace(
        metrics=SimpleNamespace(samples_per_s=rate), gossip=SimpleNamespace(me=SimpleNamespace(peer_id=me))
    )


def _rec(peer_id: str, rate: float) -> SimpleNamespace:
    return SimpleNamespace(peer_id=peer_id, samples_per_s=rate)


def test_a_daemon_balances_against_the_slowest_other_peer_of_its_lookup():
    cfg = GossipConfig(steps_per_round=10, balance_steps=2.0)
    records = [_rec("me", 1.0), _rec("a", 800.0), _rec("b", 500.0), _rec("new", 0.0)]  # own record and a newcomer
    assert balanced_steps(_peer(750.0), cfg, records) == 15  # 750 / 500 x 10
    assert balanced_steps(_peer(400.0), cfg, records) == 10  # the slowest of all: H
    assert balanced_steps(_peer(0.0), cfg, records) == 10  # its own rate not measured yet: H
    assert balanced_steps(_peer(750.0), GossipConfig(steps_per_round=10, balance_steps=1.0), records) == 10  # off


def test_balance_below_one_is_refused():
    with pytest.raises(ConfigError, match="balance_steps"):
        GossipConfig(balance_steps=0.5)


def test_two_real_daemons_the_faster_takes_the_steps_the_slower_s_announced_rate_leaves_it_and_they_stay_merged(
    tmp_path,
):
    """Two daemons of one block over real gRPC, balance 2: b announces a hundredth of the rate it measures, so once
    a sees it a takes 2 H steps a round (the cap) and b H; both merge every round and end on one state."""
    H = 3
    configs = [daemon_config(tmp_path, 0, seed=i, discovery="static", max_rounds=4, steps=H) for i in range(2)]
    configs = [replace(c, gossip=replace(c.gossip, balance_steps=2.0)) for c in configs]

    async def scenario():
        async with running(*configs) as daemons:
            link_static(daemons)
            slow = daemons[1].metrics
            measured = slow.observe_throughput

            def slower(samples, seconds, steps=0):
                measured(samples, seconds * 100, steps)

            slow.observe_throughput = slower
            await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 90)
            return daemons

    a, b = asyncio.run(scenario())
    steps_a = [r["steps"] for r in a.metrics.round_history]
    steps_b = [r["steps"] for r in b.metrics.round_history]
    assert steps_b == [H] * 4  # the slowest takes H
    assert steps_a[0] == H and 2 * H in steps_a and set(steps_a) <= {H, 2 * H}  # its own rate known after round 1
    assert a.state.local_steps == sum(steps_a) > b.state.local_steps == 4 * H
    assert a.state.round == b.state.round == 4 and a.state.block_hash == b.state.block_hash
