"""swarmd.node.settle: the replicas of a run's last round end it on one state.

Fast: in-memory Gossip peers (tests/swarm_utils.memory_swarm) sharing a board of signed records, each wrapped as the
peer settle() drives; the settles run concurrently, as separate daemons' would.
"""

from __future__ import annotations

import asyncio

import pytest
from swarm_utils import memory_round, memory_swarm

from swarmd.node import settle as settling
from swarmd.node.settle import settle

pytestmark = pytest.mark.usefixtures("one_thread")


class Peer:
    """What settle() drives of a daemon, over a memory swarm's board of records."""

    def __init__(self, gossip, board: dict, announces: bool = True):
        self.gossip, self.state, self.board, self.announces = gossip, gossip.state, board, announces
        self.stopping = asyncio.Event()

    async def records(self):
        return list(self.board.values())

    async def announce(self) -> None:
        if self.announces:
            self.board[self.gossip.me.peer_id] = self.gossip.record()

    def update_serving(self) -> None:
        pass


@pytest.fixture
def fast_poll(monkeypatch):
    monkeypatch.setattr(settling, "POLL_S", 0.01)


def test_a_replica_that_ended_the_last_round_apart_takes_its_peers_state_and_they_wait_for_it(fast_poll):
    """a, b and c merged the last round together, but c's merge landed on other weights (its deadline ran out
    before a delta came): c takes the state a and b announce, and a and b stay up until c announces it."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0)
        await memory_round(peers, board)
        a, _, c = peers
        last = a.state.round
        c.state.adopt({k: v + 0.01 for k, v in c.state.base_block.items()}, None, last)
        board[c.me.peer_id] = c.record()
        theirs = a.state.block_hash
        settled = await asyncio.gather(*(settle(Peer(g, board), last, 10.0) for g in peers))
        return settled, theirs, [g.state.block_hash for g in peers], [g.state.round for g in peers], last

    settled, theirs, hashes, rounds, last = asyncio.run(scenario())
    assert settled[0] == settled[1] == [] and "block" in settled[2]
    assert hashes == [theirs] * 3 and rounds == [last] * 3


def test_replicas_that_agree_end_at_once_and_a_partner_that_never_announces_costs_at_most_the_timeout(fast_poll):
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], codec="fp32", blocks=1, deadline_max_s=1.0)
        await memory_round(peers, board)
        last = peers[0].state.round
        agreed = await asyncio.wait_for(asyncio.gather(*(settle(Peer(g, board), last, 30.0) for g in peers)), 10)
        await memory_round(peers, board)
        del board[peers[2].me.peer_id]  # c merged the round but its record never comes (it died, or lies)
        alone = await asyncio.wait_for(settle(Peer(peers[0], board), last + 1, 0.5), 10)
        return agreed, alone, [g.state.block_hash for g in peers]

    agreed, alone, hashes = asyncio.run(scenario())
    assert agreed == [[], [], []] and alone == [] and len(set(hashes)) == 1
