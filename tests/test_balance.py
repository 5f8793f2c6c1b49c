"""Issue 22, no empty block: the balance rule (swarmd.membership.balance) and daemons that move by it.

The rule's pinned cases first (pure, over hand-made records), then real daemons on 127.0.0.1 over
one in-memory discovery board (joiners that chose the same block together; a block that lost its
last peer), then the same joiners on the real hivemind DHT (marked swarm).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from swarm_utils import daemon_config, running, wait_until

from swarmd.core import checkpoint as ck
from swarmd.membership.balance import Move, next_move, plan, served
from swarmd.membership.discovery import MemoryDiscovery
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord, choose_block
from swarmd.membership.trust import is_valid, sign_record
from swarmd.metrics import Metrics
from swarmd.node import daemon as daemon_module
from swarmd.node.daemon import Daemon
from swarmd.node.prometheus import MetricsCollector, MetricsServer


def rec(pid: str, block: int, round: int = 0, *, pinned: bool = False, client: bool = False) -> PeerRecord:
    address = "" if client else f"127.0.0.1:{1000 + sum(map(ord, pid))}"
    return PeerRecord(pid, address, block, round, 0.0, "cfg", "base", client, "sw", "emb", pinned=pinned)


def final_blocks(records: list[PeerRecord], blocks: int, trained: set[str] = frozenset()) -> dict[str, int]:
    """Where each peer ends after every one of them applied next_move once over the same view."""
    out = {}
    for r in records:
        move = next_move(records, r, blocks, trained=r.peer_id in trained)
        out[r.peer_id] = move.target if move else r.block_index
    return out


# -- the rule ------------------------------------------------------------------------------------------------------
def test_four_joiners_with_the_same_stale_view_end_with_every_block_served():
    bootstrap = rec("boot", 0, round=3)
    joiners = [f"j{i}" for i in range(4)]
    # all four looked the swarm up before any of them announced: the same view, the same choice
    assert {choose_block([bootstrap], 3) for _ in joiners} == {1}
    view = [bootstrap, *(rec(j, 1) for j in joiners)]
    assert served(view, 3) == [1, 4, 0]
    where = final_blocks(view, 3, trained={"boot"})
    assert where == {"boot": 0, "j0": 2, "j1": 0, "j2": 1, "j3": 1}  # the lowest ids move, the empty block first
    assert sorted(Counter(where.values()).values()) == [1, 2, 2]
    assert str(next_move(view, view[1], 3, trained=False)) == "block 1 has 4 peers and block 2 none: moving to block 2"
    assert str(next_move(view, view[2], 3, trained=False)) == "block 1 has 4 peers and block 0 has 1: moving to block 0"


def test_two_joiners_on_one_block_one_moves_the_lower_id():
    view = [rec("boot", 0, 5), rec("a", 1), rec("b", 1)]
    assert final_blocks(view, 3, trained={"boot"}) == {"boot": 0, "a": 2, "b": 1}
    assert next_move(view, view[2], 3, trained=False) is None
    # the peer that merged no round yet goes before one that did, whatever the ids
    view = [rec("boot", 0, 5), rec("a", 1, 5), rec("b", 1, 0)]
    assert final_blocks(view, 3, trained={"boot", "a"}) == {"boot": 0, "a": 1, "b": 2}


@pytest.mark.parametrize("rounds", list(itertools.product(range(3), repeat=4)))
def test_two_peers_of_a_block_never_both_move_however_stale_their_views(rounds):
    # each sees the other's record at a round no higher than the other's own (records only lag)
    a_now, b_now, a_seen_by_b, b_seen_by_a = rounds
    if a_seen_by_b > a_now or b_seen_by_a > b_now:
        return
    boot = rec("boot", 0, 9, pinned=True)
    a, b = rec("a", 1, a_now), rec("b", 1, b_now)
    moves = [
        next_move([boot, a, replace(b, round=b_seen_by_a)], a, 3, trained=a_now > 0),
        next_move([boot, replace(a, round=a_seen_by_b), b], b, 3, trained=b_now > 0),
    ]
    assert sum(m is not None for m in moves) <= 1


def test_no_swap_and_no_move_without_a_gain():
    assert final_blocks([rec("a", 0), rec("b", 1)], 2) == {"a": 0, "b": 1}
    assert final_blocks([rec("a", 0), rec("b", 1), rec("c", 1)], 2) == {"a": 0, "b": 1, "c": 1}  # 2 vs 1: stay
    assert final_blocks([rec("a", 0), rec("b", 0)], 1) == {"a": 0, "b": 0}
    assert final_blocks([rec("a", 1), rec("b", 1)], 2) == {"a": 0, "b": 1}


def test_random_layouts_plan_is_one_way_even_and_fills_every_block():
    rnd = random.Random(0)
    for _ in range(300):
        blocks = rnd.randint(2, 5)
        view = [
            rec(f"p{i:02d}", rnd.randrange(blocks), rnd.randint(0, 2), pinned=rnd.random() < 0.2)
            for i in range(rnd.randint(1, 12))
        ]
        before = {r.peer_id: r.block_index for r in view}
        for fill_only in (False, True):
            after = plan(view, blocks, fill_only=fill_only)
            moved = {p for p in after if after[p] != before[p]}
            sources, targets = {before[p] for p in moved}, {after[p] for p in moved}
            assert not sources & targets  # a block that receives never gives: no swaps, nobody moves twice
            assert all(not r.pinned for r in view if r.peer_id in moved)
            counts = Counter(after.values())
            donors_left = [b for b in range(blocks) if any(after[r.peer_id] == b and not r.pinned for r in view)]
            if fill_only:
                assert all(counts[b] for b in targets) and all(counts[before[p]] for p in moved)
                # an empty block is left only when no block with two peers has one free to move
                if any(counts[b] == 0 for b in range(blocks)):
                    assert not [b for b in donors_left if counts[b] >= 2 and b not in targets]
            elif not any(r.pinned for r in view):
                assert max(counts[b] for b in range(blocks)) - min(counts[b] for b in range(blocks)) <= 1
        # the fill-only moves are the first ones of the full plan: a trained peer agrees with the joiners
        full, fill = plan(view, blocks), plan(view, blocks, fill_only=True)
        assert all(full[p] == fill[p] for p in fill if fill[p] != before[p])


def test_an_explicit_block_never_moves_and_is_never_the_one_elected():
    pinned = rec("a", 0, 0, pinned=True)
    assert next_move([pinned, rec("b", 0)], pinned, 2, trained=False) is None
    # the pinned peer has the lower (round, id): the free one of its block moves instead
    view = [pinned, rec("z", 0, 7), rec("m", 1, 7)]
    assert final_blocks(view, 3, trained={"z", "m"}) == {"a": 0, "z": 2, "m": 1}
    # nobody free on the most-served block: the next most-served with a gain gives one
    view = [rec("a", 0, pinned=True), rec("b", 0, pinned=True), rec("c", 0, pinned=True), rec("d", 1), rec("e", 1)]
    assert final_blocks(view, 3) == {"a": 0, "b": 0, "c": 0, "d": 2, "e": 1}


def test_a_block_that_lost_its_last_peer_is_refilled_from_the_most_served_one():
    trained = {"a", "b", "c", "d", "e"}
    view = [rec("a", 0, 40), rec("b", 0, 40), rec("c", 1, 40), rec("d", 1, 40), rec("e", 1, 40)]
    assert final_blocks(view, 3, trained) == {"a": 0, "b": 0, "c": 2, "d": 1, "e": 1}  # block 1 has the most
    view = [rec("a", 0, 40), rec("b", 0, 40), rec("c", 1, 40), rec("d", 1, 40)]
    assert final_blocks(view, 3, trained) == {"a": 2, "b": 0, "c": 1, "d": 1}  # a tie: the lower block gives
    assert str(next_move(view, view[0], 3, trained=True)) == "block 0 has 2 peers and block 2 none: moving to block 2"
    # a trained peer fills empty blocks only; it does not even out 3 / 1 / 1
    view = [rec("a", 0, 40), rec("b", 0, 40), rec("c", 0, 40), rec("d", 1, 40), rec("e", 2, 40)]
    assert final_blocks(view, 3, trained) == {r.peer_id: r.block_index for r in view}
    # ... while a joiner on the crowded block does
    view = [*view[:3], rec("j", 0, 0), *view[3:]]
    assert final_blocks(view, 3, trained) == {"a": 0, "b": 0, "c": 0, "j": 1, "d": 1, "e": 2}


def test_client_mode_peers_serve_no_block_and_never_move():
    view = [rec("a", 0), rec("b", 0), rec("c", 1, client=True)]
    assert served(view, 2) == [2, 0]
    assert final_blocks(view, 2) == {"a": 1, "b": 0, "c": 1}
    assert next_move(view, view[2], 2, trained=False) is None


def test_the_newest_record_of_a_peer_counts_and_my_own_replaces_mine():
    old, new = replace(rec("a", 1), expires=10.0), replace(rec("a", 2), expires=20.0)
    assert served([new, old, rec("b", 0)], 3) == [1, 0, 1]
    me = rec("a", 0)
    stale_me = rec("a", 1)  # the lookup still shows where I was
    assert next_move([stale_me, rec("b", 0), rec("c", 2)], me, 3, trained=False) == Move(0, 1, 2, 0)


def test_pinned_is_part_of_the_signed_record():
    identity = Identity.generate()
    signed = sign_record(replace(rec("x", 0, pinned=True), peer_id=identity.peer_id), identity, 30)
    assert is_valid(signed) and PeerRecord.from_value(signed.to_value()) == signed
    assert not is_valid(replace(signed, pinned=False))  # flipping it breaks the signature
    assert PeerRecord.from_value({**signed.to_value(), "pinned": 1}) is None


def test_the_metrics_endpoint_labels_the_block_moved_to():
    server = MetricsServer(MetricsCollector(Metrics(), "sw", 1))
    server.set_block(2)
    labels = {s.labels.get("block") for family in server.collector.collect() for s in family.samples}
    assert labels <= {None, "2"} and "2" in labels


# -- daemons on one in-memory discovery board ------------------------------------------------------------------------
@pytest.fixture
def board(monkeypatch) -> dict[str, PeerRecord]:
    """Every daemon started in the test finds the others on this board (no DHT, no status polling)."""
    shared: dict[str, PeerRecord] = {}

    async def memory_discovery(net, plan, status, checkpoint_dir):
        return MemoryDiscovery(shared)

    monkeypatch.setattr("swarmd.node.daemon.open_discovery", memory_discovery)
    return shared


@contextlib.asynccontextmanager
async def started_together(*configs):
    """Start a Daemon per config at the same time; yield them; shut every one down whatever happens."""
    daemons = [Daemon(c) for c in configs]
    try:
        await asyncio.gather(*(d.start() for d in daemons))
        off_the_board_at_shutdown(daemons)
        yield daemons
    finally:
        for d in reversed(daemons):
            await asyncio.wait_for(d.shutdown(), 30)


def off_the_board_at_shutdown(daemons: list[Daemon]) -> None:
    for d in daemons:
        if isinstance(d.discovery, MemoryDiscovery):
            d.discovery.peer_id = d.peer_id  # its shutdown takes its record off the board


def layout(daemons: list[Daemon]) -> list[int]:
    return [d.state.block_index for d in daemons]


def consistent(d: Daemon) -> bool:
    """Everything a daemon serves and announces names the block it trains."""
    b = d.state.block_index
    return d.gossip.me.block_index == d.serving.block_index == d.presence.gossip.me.block_index == b


@pytest.mark.usefixtures("one_thread")
def test_joiners_that_chose_the_same_block_together_move_before_they_train(tmp_path, board, monkeypatch, caplog):
    monkeypatch.setattr("swarmd.node.startup.choose_block", lambda records, blocks: 1)  # the same stale view
    caplog.set_level(logging.WARNING, logger="swarmd.node.daemon")
    # a settle of 2 s (the default announce period): every joiner's record is out when each one re-checks
    slow = lambda c: replace(c, net=replace(c.net, announce_period_s=2.0, record_ttl_s=15.0))
    configs = [slow(daemon_config(tmp_path, -1, blocks=3, seed=i, discovery="static")) for i in range(1, 5)]

    async def scenario():
        boot_config = daemon_config(tmp_path, 0, blocks=3, seed=0, discovery="static")
        async with running(boot_config) as (boot,), started_together(*configs) as joiners:
            daemons = [boot, *joiners]
            announced = {pid: r.block_index for pid, r in board.items()}
            return layout(daemons), [d.peer_id for d in daemons], joiners, announced

    blocks, ids, joiners, announced = asyncio.run(scenario())
    assert blocks[0] == 0 and set(blocks) == {0, 1, 2} and sorted(Counter(blocks).values()) == [1, 2, 2]
    assert announced == dict(zip(ids, blocks))  # where the board says they train is where they do
    assert all(consistent(d) for d in joiners) and all(d.state.local_steps == 0 for d in joiners)  # before training
    assert layout(sorted(joiners, key=lambda d: d.peer_id)) == [2, 0, 1, 1]  # the two lowest ids, the empty block first
    moves = [r.getMessage() for r in caplog.records if "moving to block" in r.getMessage()]
    assert len(moves) == 2
    # the mover's count of block 1 depends on whose records were out when it looked (3 or 4 peers)
    assert any(re.search(r"block 1 has [34] peers and block 2 none: moving to block 2$", m) for m in moves)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_a_block_that_lost_its_last_peer_gets_one_back_within_a_few_rounds(tmp_path, board, overlap):
    kw = dict(blocks=3, discovery="static", deadline_max_s=3.0)
    configs = [
        daemon_config(tmp_path, 0, seed=0, **kw),  # pinned: never the one that moves
        *(daemon_config(tmp_path, -1, seed=i, checkpoint=True, **kw) for i in (1, 2, 3)),
    ]
    # with overlap, the round in flight lands on the block it was trained for before the move
    configs = [replace(c, gossip=replace(c.gossip, overlap=overlap)) for c in configs]

    async def scenario():
        async with running(*configs) as daemons:  # one after the other: auto gives blocks 1, 2, then 0
            off_the_board_at_shutdown(daemons)
            boot, j1, j2, j3 = daemons
            assert layout(daemons) == [0, 1, 2, 0]
            tasks = {d: asyncio.create_task(d.serve()) for d in daemons}
            try:
                await wait_until(lambda: min(d.state.round for d in daemons) >= 2, 60, what="two rounds")
                j2.stop()  # block 2's only peer leaves (its record goes with it)
                await asyncio.wait_for(tasks.pop(j2), 30)
                left_at = j3.state.round
                await wait_until(lambda: j3.state.block_index == 2, 30, what="block 2 refilled")
                moved_at = max(boot.state.round, j1.state.round)
                await wait_until(lambda: j3.state.round >= moved_at + 1, 60, what="a round on block 2")
                return layout([boot, j1, j3]), left_at, moved_at, consistent(j3), j3
            finally:
                for d in tasks:
                    d.stop()
                await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 30)

    blocks, left_at, moved_at, ok, j3 = asyncio.run(scenario())
    assert blocks == [0, 1, 2] and ok
    assert moved_at - left_at <= 5, (left_at, moved_at)  # within a few rounds (2 checks, 1 round each)
    # its checkpoint is a generation of block 2 now, and a restart with --block auto resumes block 2 from it
    directory = Path(j3.config.checkpoint_dir)
    body = json.loads((directory / "config.json").read_text())
    assert ck.peer_block(directory) == 2 and body["block_index"] == 2
    assert not list(directory.glob("gen-*/block_000.safetensors"))  # block 0's state is gone with the move

    async def restart():
        async with running(j3.config) as (again,):
            return again.state.block_index, again.state.block_hash, again.state.round

    assert asyncio.run(restart()) == (2, j3.state.block_hash, j3.state.round)


# -- the real DHT ----------------------------------------------------------------------------------------------------
@pytest.mark.swarm
@pytest.mark.usefixtures("one_thread")
def test_four_joiners_started_in_the_same_second_on_the_dht_end_with_every_block_served(tmp_path, monkeypatch):
    # the joiners look the swarm up together: none has announced when the others choose (processes started
    # in the same second do the same: each one's lookup comes long before its first announce)
    chosen: list[int] = []
    real_open_state = daemon_module.open_state

    async def open_together(config, saved_block, discovery, peer_seed):
        state = await real_open_state(config, saved_block, discovery, peer_seed)
        if config.net.initial_peers:  # a joiner
            chosen.append(state.block_index)
            await wait_until(lambda: len(chosen) == 4, 60, what="every joiner's block choice")
        return state

    monkeypatch.setattr(daemon_module, "open_state", open_together)

    async def scenario():
        async with running(daemon_config(tmp_path, -1, blocks=3, seed=0, deadline_max_s=3.0)) as (boot,):
            peers = tuple(boot.discovery.multiaddrs())
            configs = [
                daemon_config(tmp_path, -1, blocks=3, seed=i, initial_peers=peers, deadline_max_s=3.0)
                for i in range(1, 5)
            ]
            async with started_together(*configs) as joiners:
                daemons = [boot, *joiners]
                tasks = [asyncio.create_task(d.serve()) for d in daemons]
                try:
                    await wait_until(lambda: set(layout(daemons)) == {0, 1, 2}, 45, what="every block served")
                    return layout(daemons), [consistent(d) for d in daemons]
                finally:
                    for d in daemons:
                        d.stop()
                    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    blocks, ok = asyncio.run(scenario())
    assert {0, *chosen} != {0, 1, 2}  # the choices left a block empty (all chose block 1: the same view)
    assert set(blocks) == {0, 1, 2} and all(ok)
