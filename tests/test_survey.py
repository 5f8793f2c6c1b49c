"""Survey summary on hand-built PeerStatus messages: per-block consensus distance and the swarm view.

consensus_by_block compares the count-sketches of the peers of one block that are at the block's
top round (max pairwise ||a - b|| / param_norm); summarize adds per-block peer counts and combined
samples/s and the swarm's max consensus distance. Sketch values below are small integers, exact
in the proto's float32, so every distance is known by hand. survey_discovered on a stand-in client: every
GetStatus and the GetConfig at once, the config asked again of the next peer when the first fails.
No network, no torch.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from swarmd.averaging.sketch import sketch_distance
from swarmd.errors import PeerUnavailable
from swarmd.membership.records import PeerRecord
from swarmd.tools.survey import consensus_by_block, peer_row, summarize, survey_discovered
from swarmd.v1 import swarm_pb2 as pb


def status(peer_id: str, block: int, round: int, sketch: list[float], norm: float = 10.0, sps: float = 1.0):
    return pb.PeerStatus(
        peer_id=peer_id, block_index=block, round=round, sketch=sketch, param_norm=norm, samples_per_s=sps
    )


def test_sketch_distance_by_hand():
    assert sketch_distance([0.0, 0.0], [3.0, 4.0], 10.0) == pytest.approx(0.5)  # ||(3, 4)|| = 5
    assert sketch_distance([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 7.0) == 0.0
    assert sketch_distance([0.0], [3.0], 0.0) == 0.0  # zero norm: nothing to compare against
    assert math.isnan(sketch_distance([0.0], [3.0, 4.0], 1.0))  # different sizes: not comparable
    assert math.isnan(sketch_distance([], [], 1.0))


def test_identical_sketches_are_at_distance_zero():
    same = [1.0, -2.0, 0.5, 4.0]
    statuses = [status("a", 0, 3, same), status("b", 0, 3, same), status("c", 0, 3, same)]
    assert consensus_by_block(statuses) == {0: 0.0}


def test_known_distance_is_the_max_pair_over_the_param_norm():
    statuses = [
        status("a", 0, 2, [0.0, 0.0]),
        status("b", 0, 2, [3.0, 4.0]),  # 5 from a
        status("c", 0, 2, [6.0, 8.0]),  # 10 from a, 5 from b
    ]
    assert consensus_by_block(statuses) == {0: pytest.approx(1.0)}  # 10 / param_norm 10
    assert consensus_by_block(statuses[:2]) == {0: pytest.approx(0.5)}


def test_only_peers_at_the_blocks_top_round_are_compared():
    statuses = [
        status("a", 0, 5, [0.0, 0.0]),
        status("b", 0, 5, [3.0, 4.0]),
        status("stale", 0, 4, [60.0, 80.0]),  # a round behind: its distance (10x) does not count
        status("c", 1, 7, [1.0, 1.0]),
        status("d", 1, 6, [9.0, 9.0]),  # block 1 has one peer at its top round
    ]
    assert consensus_by_block(statuses) == {0: pytest.approx(0.5), 1: 0.0}


def test_a_single_peer_is_in_consensus_and_a_block_without_sketches_is_unknown():
    single = consensus_by_block([status("a", 2, 1, [3.0, 4.0])])
    assert single == {2: 0.0}
    unknown = consensus_by_block([status("a", 0, 1, []), status("b", 0, 1, [])])  # e.g. no sketch reported yet
    assert list(unknown) == [0] and math.isnan(unknown[0])
    assert consensus_by_block([]) == {}


def test_summarize_per_block_and_swarm():
    statuses = [
        status("a", 0, 5, [0.0, 0.0], sps=10.0),
        status("b", 0, 5, [3.0, 4.0], sps=5.0),
        status("c", 1, 5, [1.0, 2.0], norm=4.0, sps=2.5),
        status("d", 1, 5, [1.0, 6.0], norm=4.0, sps=2.5),  # 4 / 4 from c: the swarm's worst block
    ]
    summary = summarize([peer_row(s) for s in statuses], statuses, blocks=3)
    assert [r["peer_id"] for r in summary["peers"]] == ["a", "b", "c", "d"]
    blocks = summary["blocks"]
    assert [(b["block"], b["peers"], b["samples_per_s"]) for b in blocks] == [(0, 2, 15.0), (1, 2, 5.0), (2, 0, 0)]
    assert blocks[0]["consensus_distance"] == pytest.approx(0.5)
    assert blocks[1]["consensus_distance"] == pytest.approx(1.0)
    assert math.isnan(blocks[2]["consensus_distance"])  # nobody trains block 2
    assert summary["consensus_distance"] == pytest.approx(1.0)


def test_summarize_a_single_peer_and_infers_the_block_count():
    st = status("solo", 1, 0, [2.0, 2.0], sps=7.0)
    summary = summarize([peer_row(st)], [st])
    assert [b["block"] for b in summary["blocks"]] == [0, 1]  # blocks 0..max block seen
    assert summary["blocks"][1]["peers"] == 1 and summary["blocks"][1]["samples_per_s"] == 7.0
    assert summary["blocks"][1]["consensus_distance"] == 0.0
    assert summary["consensus_distance"] == 0.0
    empty = summarize([], [])
    assert empty["blocks"] == [] and math.isnan(empty["consensus_distance"])


class Peers:
    """A PeerClient stand-in for survey_discovered: counts calls in flight; `no_config` peers fail GetConfig."""

    def __init__(self, blocks: int = 4, no_config: tuple[str, ...] = ()):
        self.blocks, self.no_config = blocks, set(no_config)
        self.inflight = self.most_inflight = 0
        self.config_asked: list[str] = []

    async def _call(self) -> None:
        self.inflight += 1
        self.most_inflight = max(self.most_inflight, self.inflight)
        await asyncio.sleep(0.05)
        self.inflight -= 1

    async def status(self, address: str, timeout_s: float) -> pb.PeerStatus:
        await self._call()
        return pb.PeerStatus(peer_id=f"id-{address}", block_index=int(address[-1]), address=address)

    async def swarm_config(self, address: str, timeout_s: float) -> pb.SwarmConfig:
        self.config_asked.append(address)
        await self._call()
        if address in self.no_config:
            raise PeerUnavailable(f"{address}: no config")
        return pb.SwarmConfig(model_config_json=json.dumps({"blocks": self.blocks}))


class Found:
    """A discovery whose find_all returns unsigned records of these addresses (block: the address's last digit)."""

    def __init__(self, *addresses: str):
        self.records = [PeerRecord(f"id-{a}", a, int(a[-1]), 0, 0.0, "hash", "", False, "test") for a in addresses]

    async def find_all(self) -> list[PeerRecord]:
        return list(self.records)


def test_a_survey_asks_every_peer_and_the_config_at_once():
    peers = Peers()
    summary = asyncio.run(survey_discovered(Found("h:0", "h:1", "h:2"), peers))
    assert sorted(r["address"] for r in summary["peers"]) == ["h:0", "h:1", "h:2"]
    assert peers.most_inflight == 4 and peers.config_asked == ["h:0"]  # 3 GetStatus beside 1 GetConfig
    assert len(summary["blocks"]) == 4  # the config's block count, block 3 without a peer included


def test_a_survey_asks_the_next_peer_for_the_config_when_the_first_fails():
    peers = Peers(blocks=2, no_config=("h:0",))
    summary = asyncio.run(survey_discovered(Found("h:0", "h:1"), peers))
    assert peers.config_asked == ["h:0", "h:0", "h:1"] and len(summary["blocks"]) == 2
    every = Peers(no_config=("h:0", "h:1"))
    with pytest.raises(PeerUnavailable, match="h:1: no config"):
        asyncio.run(survey_discovered(Found("h:0", "h:1"), every))
