"""The grow schedule in daemons with peers that move (TrainConfig.pipeline + grow, --block auto): the balance rule
over the blocks open at the coming round (swarmd.membership.balance's open_blocks, coming_round), the daemon's
side of it (swarmd.node.rebalance: grow_open, the confirm a round ahead of an opening), the warm start of a block
nobody trained (swarmd.node.training.never_trained); then three real daemons on the hivemind DHT."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from dataclasses import replace

import pytest
from swarm_utils import daemon_config, running, wait_until

from swarmd.averaging.state import BlockState
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.membership.balance import coming_round, next_move, plan
from swarmd.membership.identity import Identity
from swarmd.membership.opening import Opening, trained_open
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import is_valid, sign_record
from swarmd.node.config import DaemonConfig
from swarmd.node.rebalance import Rebalancer, grow_open
from swarmd.node.startup import new_state
from swarmd.node.training import never_trained, windowed


def rec(pid: str, block: int, round: int = 0, *, pinned: bool = False, first: int = 0) -> PeerRecord:
    address = f"127.0.0.1:{1000 + sum(map(ord, pid))}"
    return PeerRecord(
        pid, address, block, round, 0.0, "cfg", "base", False, "sw", "emb", pinned=pinned, train_first=first
    )


def grow_config(blocks: int = 3, stagger: int = 2) -> DaemonConfig:
    model = ModelConfig(blocks=blocks, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    return DaemonConfig(model=model, train=TrainConfig(pipeline=True, grow=True, pipeline_stagger=stagger))


def moves(view: list[PeerRecord], blocks: int, open_blocks: int, trained: set[str]) -> dict[str, int]:
    """Where each peer ends once every one applied next_move once over the same view."""
    out = {}
    for r in view:
        move = next_move(view, r, blocks, trained=r.peer_id in trained, open_blocks=open_blocks)
        out[r.peer_id] = move.target if move else r.block_index
    return out


# -- the rule ------------------------------------------------------------------------------------------------------
def test_the_blocks_open_at_round_r_are_those_with_b_times_g_below_r():
    config = grow_config(blocks=3, stagger=2)
    opened = [grow_open(config, rec("a", 0, round=r - 1, first=1), []) for r in range(1, 8)]
    assert opened == [1, 1, 2, 2, 3, 3, 3]
    assert grow_open(config, rec("a", 0, round=1, first=1), [], ahead=1) == 2  # the next round opens block 1
    # our record's window counts from a later start (a run that began at round 10): block 1 opens at round 13
    assert [grow_open(config, rec("a", 1, round=r - 1, first=13), []) for r in (11, 12, 13)] == [1, 1, 2]
    # every other schedule: every block is open
    assert grow_open(replace(config, train=TrainConfig(pipeline=True)), rec("a", 0), []) is None
    assert grow_open(replace(config, train=TrainConfig(grow=True)), rec("a", 0), []) is None


def test_a_joiner_goes_by_the_median_round_which_a_lying_peer_does_not_move():
    swarm = [rec("a", 0, 7), rec("b", 0, 8), rec("c", 1, 8)]
    assert coming_round(swarm) == 9 and coming_round(swarm, own_round=3, own_id="j") == 9
    assert coming_round([*swarm, rec("liar", 0, 10**6)]) == 9  # one far round in four
    assert coming_round([], own_round=4) == 5 and coming_round(swarm, own_round=20) == 21
    assert coming_round([rec("a", 0, 9), rec("a", 0, 2)], own_id="a") == 1  # our own records do not count


def test_peers_of_blocks_not_open_yet_become_replicas_of_the_open_ones():
    view = [rec("a", 0, 3), rec("b", 1, 0), rec("c", 2, 0), rec("d", 2, 0)]
    # one open block: everyone on block 0, trained or not
    assert moves(view, 3, 1, trained={"a", "b", "c", "d"}) == dict.fromkeys("abcd", 0)
    # two open: the displaced go to the least-served open block first
    assert Counter(plan(view, 3, open_blocks=2).values()) == {0: 2, 1: 2}
    move = next_move(view, view[2], 3, trained=True, open_blocks=1)
    assert move is not None and str(move) == "block 2 is not open yet and block 0 has 1: moving to block 0"


def test_a_block_opening_pulls_exactly_one_trained_peer_in():
    for peers in range(2, 7):
        view = [rec(f"p{i}", 0, 4) for i in range(peers)]
        trained = {r.peer_id for r in view}
        assert moves(view, 3, 1, trained) == {r.peer_id: 0 for r in view}  # nothing opens: nobody moves
        after = moves(view, 3, 2, trained)
        assert sorted(after.values()) == [0] * (peers - 1) + [1], peers
        assert after["p0"] == 1  # the lowest peer id
        # then block 2 opens over that layout: one more (only from a block with two peers more than 0)
        grown = [replace(r, block_index=after[r.peer_id]) for r in view]
        third = moves(grown, 3, 3, trained)
        assert Counter(third.values()) == ({0: peers - 2, 1: 1, 2: 1} if peers >= 3 else {0: 1, 1: 1}), peers


def test_records_a_round_stale_still_elect_exactly_one_trained_mover():
    peers = ["a", "b", "c"]
    movers = []
    for me in peers:  # each sees its own record at round 4, the others' a round behind
        view = [rec(p, 0, 4 if p == me else 3) for p in peers]
        if next_move(view, view[peers.index(me)], 2, trained=True, open_blocks=2) is not None:
            movers.append(me)
    assert movers == ["a"]


def test_pinned_peers_never_move_and_wait_for_their_block_to_open():
    view = [rec("a", 0, 4, pinned=True), rec("b", 0, 4, pinned=True), rec("z", 1, 4, pinned=True)]
    assert moves(view, 2, 1, trained={"a", "b", "z"}) == {"a": 0, "b": 0, "z": 1}
    assert moves(view, 2, 2, trained={"a", "b", "z"}) == {"a": 0, "b": 0, "z": 1}
    # a pinned peer waiting on block 1 serves it once it opens: no auto peer moves in
    view = [rec("a", 0, 4), rec("b", 0, 4), rec("z", 1, 4, pinned=True)]
    assert moves(view, 2, 2, trained={"a", "b", "z"}) == {"a": 0, "b": 0, "z": 1}
    # ... while it is not open, the pinned peer counts nowhere and the auto peers stay on block 0
    assert moves(view, 2, 1, trained={"a", "b"}) == {"a": 0, "b": 0, "z": 1}


def test_random_grow_layouts_keep_moves_one_way_and_every_free_peer_on_an_open_block():
    rnd = random.Random(1)
    for _ in range(300):
        blocks = rnd.randint(2, 5)
        n = rnd.randint(1, blocks)
        view = [
            rec(f"p{i:02d}", rnd.randrange(blocks), rnd.randint(0, 2), pinned=rnd.random() < 0.2)
            for i in range(rnd.randint(1, 12))
        ]
        before = {r.peer_id: r.block_index for r in view}
        for fill_only in (False, True):
            after = plan(view, blocks, fill_only=fill_only, open_blocks=n)
            moved = {p for p in after if after[p] != before[p]}
            assert not {before[p] for p in moved} & {after[p] for p in moved}  # no swaps, nobody moves twice
            assert all(not r.pinned for r in view if r.peer_id in moved)
            assert all(after[r.peer_id] < n for r in view if not r.pinned)
            assert all(after[p] < n for p in moved)


# -- the daemon's side ---------------------------------------------------------------------------------------------
def test_a_trained_peer_names_the_opening_block_a_round_ahead_and_moves_when_it_opens():
    view = [rec("a", 0, 2), rec("b", 0, 2), rec("c", 0, 2)]
    me = view[0]
    rebalancer = Rebalancer()
    assert rebalancer.decide(view, me, 2, trained=True, looked_up=1.0, open_now=1, open_next=2) is None
    move = rebalancer.decide(view, me, 2, trained=True, looked_up=2.0, open_now=2, open_next=2)
    assert move is not None and (move.source, move.target) == (0, 1)
    # without the round ahead, the opening's own lookup only names it: the next one confirms
    late = Rebalancer()
    assert late.decide(view, me, 2, trained=True, looked_up=2.0, open_now=2, open_next=2) is None
    assert late.decide(view, me, 2, trained=True, looked_up=3.0, open_now=2, open_next=2) is not None
    # the check the round before an opening looks the swarm up afresh, so that the records show the last round
    config = grow_config(blocks=3, stagger=2)
    ahead = [Rebalancer().opening_next(config, rec("a", 0, round=r, first=1)) for r in range(5)]
    assert ahead == [False, True, False, True, False]  # blocks 1 and 2 open at rounds 3 and 5
    open_ended = replace(config, train=replace(config.train, open_gain=0.1))
    assert not Rebalancer().opening_next(open_ended, rec("a", 0, round=1))
    # the others of block 0 never move
    for other in view[1:]:
        r = Rebalancer()
        assert r.decide(view, other, 2, trained=True, looked_up=1.0, open_now=1, open_next=2) is None
        assert r.decide(view, other, 2, trained=True, looked_up=2.0, open_now=2, open_next=2) is None


def test_a_block_nobody_trained_is_the_one_to_warm_start():
    config = grow_config(blocks=2)
    fresh, first = new_state(config, 1, peer_seed=5), new_state(config, 0, peer_seed=5)
    assert never_trained(fresh) and not never_trained(first)  # block 0 has no predecessor to start from
    _, block, _ = new_state(replace(config, train=replace(config.train, seed=1)), 1, 0).snapshot()
    fresh.adopt(block, None)  # what a re-sync to the block's trained peers does
    assert not never_trained(fresh)


# -- three daemons on the real DHT ---------------------------------------------------------------------------------
def own_optimizer_only(d) -> bool:
    """The daemon's optimizer holds parameters (and moments) of its own block and byte table only."""
    trainer = d.state.trainer
    owned = {id(p) for p in (*trainer.block.parameters(), *trainer.emb.parameters())}
    in_optimizer = {id(p) for g in trainer.opt.param_groups for p in g["params"]}
    frozen = all(not p.requires_grad and p.grad is None for o in trainer.others.values() for p in o.parameters())
    return in_optimizer <= owned and {id(p) for p in trainer.opt.state} <= owned and frozen


@pytest.mark.swarm
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("open_gain", [0.0, 100.0], ids=["rounds", "open-ended"])
def test_three_auto_peers_grow_block_0_then_one_moves_and_warm_starts_block_1(tmp_path, monkeypatch, caplog, open_gain):
    """G = 2: block 1 opens at round 3; open-ended, once block 0's CE gained less than open_gain (100 nats: at once)
    for 2 rounds, as the records report it (3 observations: round 4 at the earliest)."""
    caplog.set_level(logging.INFO, logger="swarmd.node")
    starts: list[tuple[int, int, int, bool]] = []  # (block, round, local steps, warm-started) of every attempt
    real_warm_start = BlockState.warm_start

    def warm_start(state):
        done = real_warm_start(state)
        starts.append((state.block_index, state.round, state.local_steps, done))
        return done

    monkeypatch.setattr(BlockState, "warm_start", warm_start)
    schedule = dict(pipeline=True, grow=True, pipeline_stagger=2, open_gain=open_gain)
    grow = lambda c: replace(c, train=replace(c.train, **schedule))
    rounds: dict[int, list[tuple[int, int, int, bool]]] = {}  # seed -> (round, block, local steps, optimizer ok)

    def watch(d, seed):
        d.on_round = lambda report: rounds.setdefault(seed, []).append(
            (d.state.round, d.state.block_index, d.state.local_steps, own_optimizer_only(d))
        )

    def on_block_1() -> int:  # rounds merged on block 1, by any peer
        return max((sum(b == 1 for _, b, _, _ in seen) for seen in list(rounds.values())), default=0)

    async def scenario():
        boot_config = grow(daemon_config(tmp_path, -1, blocks=2, seed=0, deadline_max_s=3.0))
        async with running(boot_config) as (boot,):
            peers = tuple(boot.discovery.multiaddrs())
            configs = [
                grow(daemon_config(tmp_path, -1, blocks=2, seed=i, initial_peers=peers, deadline_max_s=3.0))
                for i in (1, 2)
            ]
            async with running(*configs) as joiners:
                daemons = [boot, *joiners]
                assert [d.state.block_index for d in daemons] == [0, 0, 0]  # only block 0 is open at round 1
                for seed, d in enumerate(daemons):
                    watch(d, seed)
                tasks = [asyncio.create_task(d.serve()) for d in daemons]
                try:
                    await wait_until(lambda: on_block_1() >= 2, 120, what="two rounds on block 1")
                    return [d.state.block_index for d in daemons], [d.gossip.record() for d in daemons]
                finally:
                    for d in daemons:
                        d.stop()
                    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    layout, records = asyncio.run(scenario())
    assert sorted(layout) == [0, 0, 1]
    mover = layout.index(1)
    # every peer trains block 0 in the growth phase (rounds 1 and 2), with its own optimizer only, always
    for seed, seen in rounds.items():
        assert all(ok for *_, ok in seen), seed
        assert all(block == 0 and steps > 0 for r, block, steps, _ in seen if r <= 2), (seed, seen)
    # one peer moved to block 1 once it opened and never back; the others stayed on block 0
    moved_at = min(r for r, block, _, _ in rounds[mover] if block == 1)
    assert (3 <= moved_at <= 4) if not open_gain else (5 <= moved_at <= 9), rounds[mover]
    assert all(block == 1 for r, block, _, _ in rounds[mover] if r >= moved_at)
    assert all(block == 0 for s, seen in rounds.items() if s != mover for _, block, _, _ in seen)
    moves = [m.getMessage() for m in caplog.records if "moving to block" in m.getMessage()]
    assert len(moves) == 1 and moves[0].endswith("block 0 has 3 peers and block 1 none: moving to block 1"), moves
    # its first round on block 1 warm-started it from block 0's merged state, once; nobody else warm-started
    assert [(b, r, steps) for b, r, steps, done in starts if done] == [(1, moved_at - 1, 0)], starts
    # the round-based rule's records carry block 1's window; the open-ended rule's carry the held-out CE instead
    if open_gain:
        assert all(r.held_out_ce > 0 and (r.train_first, r.train_last) == (0, 0) for r in records), records
    else:
        assert [r.train_first for r in records] == [3 if b else 1 for b in layout] and not any(
            r.held_out_ce for r in records
        )


# -- the open-ended rule (TrainConfig.open_gain) ------------------------------------------------------------------
def measured(pid: str, block: int, round: int, ce: float, **kw) -> PeerRecord:
    return replace(rec(pid, block, round, **kw), held_out_ce=ce)


def test_a_block_counts_as_open_once_a_record_reports_training_it():
    assert trained_open([], 3) == 1 and trained_open([rec("a", 2, 5)], 3) == 1  # on block 2, not measured
    assert trained_open([measured("a", 0, 5, 4.0), measured("b", 1, 5, 4.5)], 3) == 2
    client = replace(measured("c", 2, 5, 4.0), address="", client_mode=True)
    assert trained_open([client, measured("d", 7, 5, 4.0)], 3) == 1  # client mode and unknown blocks count for none
    assert trained_open([measured("a", 0, 5, 4.0), measured("z", 2, 5, 4.0)], 3) == 1  # block 1 first


def test_the_next_block_opens_once_the_frontier_gained_too_little_for_patience_rounds():
    rule = Opening(gain=0.05, patience=2)
    ces = [5.0, 4.0, 3.98, 3.97, 3.96]
    look = lambda r, ce: [measured("a", 0, r, ce), measured("b", 0, r, ce + 0.1)]
    opened = [rule.observe(look(r, ce), r, 3) for r, ce in enumerate(ces, 1)]
    assert opened == [1, 1, 1, 2, 2]  # gains 1.0, 0.02, 0.01: the last two below 0.05 at round 4
    assert rule.gains() == [] and rule.since == 4  # the new frontier's observations start afresh
    # a lookup that shows nothing new is no plateau: the same records round after round open nothing
    stale = Opening(gain=0.05, patience=2)
    assert {stale.observe([measured("a", 0, 1, 4.0)], r, 3) for r in range(1, 20)} == {1}
    assert Opening(0.05, 2).observe([measured("a", 0, 3, 4.0), measured("b", 1, 3, 5.0)], 3, 3) == 2  # first look


def test_a_lying_peer_opens_no_more_than_one_block_per_patience_plus_one_of_our_rounds():
    rule = Opening(gain=0.05, patience=2)
    timeline = []
    for r in range(1, 14):  # a liar reports a flat CE on whatever block is the frontier, and one on the last block
        records = [measured("liar", rule.opened - 1 if rule.opened else 0, r, 4.0), measured("liar2", 4, r, 4.0)]
        timeline.append(rule.observe(records, r, 5))
    assert timeline == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5]  # at worst the round-based rule with G = 3
    # a record on the next block opens it at once only on a peer's first look; later, patience + 1 rounds on
    honest = Opening(gain=0.05, patience=2)
    assert honest.observe([measured("a", 0, 1, 5.0)], 1, 3) == 1
    look = lambda r: [measured("a", 0, r, 5.0 - r), measured("x", 1, r, 9.0)]
    assert [honest.observe(look(r), r, 3) for r in (2, 3, 4)] == [1, 1, 2]
    assert honest.observe([measured("a", 0, 5, 0.5)], 5, 3) == 2  # blocks never close


def test_held_out_ce_is_signed_parsed_back_and_left_out_while_zero():
    identity = Identity.generate()
    mine = replace(rec("x", 1, 3), peer_id=identity.peer_id)
    plain, with_ce = sign_record(mine, identity, 30), sign_record(replace(mine, held_out_ce=4.25), identity, 30)
    assert "held_out_ce" not in plain.to_value() and PeerRecord.from_value(plain.to_value()) == plain
    assert is_valid(with_ce) and PeerRecord.from_value(with_ce.to_value()) == with_ce
    assert not is_valid(replace(with_ce, held_out_ce=0.5))  # tampered
    for bad in (-1.0, float("nan"), True, "4.0"):
        assert PeerRecord.from_value({**with_ce.to_value(), "held_out_ce": bad}) is None


def test_open_gain_reaches_the_peer_config_and_needs_the_grow_schedule():
    from dataclasses import fields
    from pathlib import Path

    from cli import options as o
    from swarmd.errors import ConfigError

    given = {f.name: o.PeerOptions.DEFAULTS.get(f.name) for f in fields(o.PeerOptions)}
    plain = {f.name: None for f in fields(o.TrainOptions)}
    grow = o.TrainOptions(**{**plain, "pipeline": True, "grow": True})
    peer = o.PeerOptions(**{**given, "open_gain": 0.02})
    config = peer.config(ModelConfig(), grow, [], Path(__file__), None)
    assert (config.train.open_gain, config.train.open_patience) == (0.02, 2)
    assert DaemonConfig.from_dict(config.to_dict()).train.open_gain == 0.02
    with pytest.raises(ConfigError, match=r"needs the grow schedule \(--pipeline --grow\)"):
        peer.config(ModelConfig(), o.TrainOptions(**plain), [], Path(__file__), None)
    with pytest.raises(ValueError, match="open_gain must be >= 0"):
        TrainConfig(pipeline=True, grow=True, open_gain=float("inf"))
    # the records' open blocks, not the rounds: every block's record trains every round
    open_ended = replace(grow_config(), train=replace(grow_config().train, open_gain=0.02))
    assert windowed(rec("a", 0), 2, open_ended.train, (0, 0)).train_first == 0
    assert windowed(rec("a", 0), 2, grow_config().train, (0, 0)).train_first == 5
    assert windowed(rec("a", 0, pinned=True), 2, open_ended.train, (0, 0)).train_first == 5  # --block N: the rounds
