"""Chained predecessor pulls (GossipConfig.pull_codec "int8-chain", swarmd.averaging.pull_chain): the serving side's
starts and steps, error feedback along a chain, restarts, its bound on held states, the simulator's hand-off, and two
daemons on 127.0.0.1 whose block-1 peer pulls block 0 along a chain."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch
from swarm_utils import link_static, running, trajectory_config

from swarmd.averaging.pull_chain import CHAIN_ROUNDS, PullChains, chain_pull, chain_step, own_decoding
from swarmd.averaging.state import relative_distance, weights_hash
from swarmd.errors import ValidationError
from swarmd.protocol import PayloadKind

pytestmark = pytest.mark.usefixtures("one_thread")


def _header(kind: PayloadKind) -> dict:
    return dict(swarm_id="s", config_hash="c", kind=kind, block_index=0, round=0, peer_id="p")


def _walk(seed: int, rounds: int) -> list[dict[str, torch.Tensor]]:
    """A block's merged states over `rounds` rounds: weights of scale 0.05 moving about 1% a round."""
    g = torch.Generator().manual_seed(seed)
    w = {"w": torch.randn(48, 64, generator=g) * 0.05, "b": torch.randn(64, generator=g) * 0.05}
    states = [w]
    for _ in range(rounds - 1):
        w = {k: v + torch.randn(v.shape, generator=g) * 5e-4 for k, v in w.items()}
        states.append(w)
    return states


class Puller:
    """A puller's side, as swarmd.averaging.pulls does it: hold what it decoded, name its hash next time."""

    def __init__(self):
        self.held: dict[str, torch.Tensor] | None = None
        self.bytes: list[int] = []
        self.kinds: list[int] = []

    def pull(self, chains: PullChains, weights: dict[str, torch.Tensor], round: int) -> dict[str, torch.Tensor]:
        against = weights_hash(self.held) if self.held is not None else ""
        enc = chains.answer(weights, weights_hash(weights), round, against)
        self.bytes.append(enc.wire_bytes)
        self.kinds.append(enc.header.kind)
        if enc.header.kind == PayloadKind.BLOCK_DELTA.to_pb():
            assert self.held is not None and enc.header.base_hash == against
            self.held = chain_step(self.held, own_decoding(enc, self.held))
        else:
            assert enc.header.base_hash == weights_hash(weights)  # a start names the fp32 weights, as a pull does
            self.held = own_decoding(enc, weights)
        return self.held


def test_a_chain_sends_the_block_once_then_steps_that_keep_the_puller_within_a_round_s_rounding():
    states = _walk(0, 20)
    chains, puller = PullChains(_header), Puller()
    errors = [relative_distance(w, puller.pull(chains, w, r)) for r, w in enumerate(states)]
    assert puller.kinds[0] == PayloadKind.BLOCK_STATE.to_pb()
    assert all(k == PayloadKind.BLOCK_DELTA.to_pb() for k in puller.kinds[1:])
    assert max(puller.bytes[1:]) < 0.6 * puller.bytes[0]  # a step costs well under the block
    # error feedback: a step corrects what the one before rounded off, so the error does not grow along the chain
    # and stays below the int8 start's (steps of a 1% move, against steps of the weights themselves)
    assert max(errors[5:]) < errors[0] and errors[-1] < 2 * min(errors[1:])


def test_two_pullers_on_one_chain_get_the_same_step_and_an_unknown_state_a_start():
    states = _walk(1, 3)
    chains, a, b = PullChains(_header), Puller(), Puller()
    for r, w in enumerate(states):
        a.pull(chains, w, r)
        b.pull(chains, w, r)
    assert a.bytes == b.bytes and all(torch.equal(a.held[k], b.held[k]) for k in a.held)
    assert weights_hash(a.held) in chains._states  # the server holds exactly what its pullers hold
    stranger = chains.answer(states[-1], weights_hash(states[-1]), 2, "0" * 16)
    assert stranger.header.kind == PayloadKind.BLOCK_STATE.to_pb()


def test_chains_restart_every_chain_rounds_and_hold_at_most_max_chains_states():
    states = _walk(2, 4)
    chains, puller = PullChains(_header, max_chains=2), Puller()
    puller.pull(chains, states[0], CHAIN_ROUNDS - 2)
    puller.pull(chains, states[1], CHAIN_ROUNDS - 1)
    puller.pull(chains, states[2], CHAIN_ROUNDS)  # a new epoch: the block again, a new chain's start
    puller.pull(chains, states[3], CHAIN_ROUNDS + 1)
    start, step = PayloadKind.BLOCK_STATE.to_pb(), PayloadKind.BLOCK_DELTA.to_pb()
    assert puller.kinds == [start, step, start, step]
    assert len(chains) == 2


def test_the_simulator_s_chain_pull_steps_within_an_epoch_and_starts_at_its_end():
    states = _walk(3, 3)
    held, wire, new = chain_pull(states[0], None, 0, 0, 0)
    assert new
    nxt, step_wire, new = chain_pull(states[1], held, 1, 0, 0)
    assert not new and step_wire < 0.6 * wire and relative_distance(states[1], nxt) < relative_distance(states[0], held)
    assert chain_pull(states[2], nxt, CHAIN_ROUNDS, 0, 0)[2]


def test_a_block_1_daemon_pulls_block_0_along_a_chain(tmp_path):
    def chained(cfg):
        return replace(cfg, gossip=replace(cfg.gossip, pull_codec="int8-chain"))

    async def scenario():
        configs = [chained(trajectory_config(tmp_path, b, blocks=2)) for b in range(2)]
        async with running(*configs) as daemons:
            link_static(daemons)
            first, last = daemons
            pulled = []
            for _ in range(3):
                before = last.metrics.bytes_pulled
                assert await asyncio.wait_for(last.load_predecessors(), 30) == 1
                pulled.append(last.metrics.bytes_pulled - before)
                merged = {k: v.clone() for k, v in first.state.base_block.items()}
                runs = dict(last.state.predecessors[0])
                assert relative_distance(merged, runs) < 0.02
                moved = {k: v + 1e-3 * torch.randn_like(v) for k, v in merged.items()}
                first.state.adopt(moved, None)  # block 0's next merged state
            held = last.gossip.agreement.pulls.held_chains[0]
            chains = first.gossip.agreement.pulls.chains
            # a peer from before chained pulls refuses a compact pull against a state: the block itself, again
            first.gossip.agreement.pulls.chains = Refusing(chains)
            before = last.metrics.bytes_pulled
            assert await asyncio.wait_for(last.load_predecessors(), 30) == 1
            again = last.metrics.bytes_pulled - before, last.gossip.agreement.pulls.held_chains[0]
            return pulled, held, chains, again

    pulled, held, chains, (again, restarted) = asyncio.run(scenario())
    assert pulled[1] < 0.7 * pulled[0] and pulled[2] < 0.7 * pulled[0]  # steps after the start
    assert held[0] in chains._states and held[0] == weights_hash(held[1])
    assert again >= 0.9 * pulled[0] and restarted[0] in chains._states  # a start, whose decoding the server keeps


class Refusing:
    """PullChains as a peer from before chained pulls answers: a request naming a held state is refused."""

    def __init__(self, chains: PullChains):
        self.chains = chains

    def answer(self, weights, weights_hash_, round, against=""):
        if against:
            raise ValidationError("a pull against a held state is a compact pull of working weights")
        return self.chains.answer(weights, weights_hash_, round)
