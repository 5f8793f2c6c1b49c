"""Fresher trajectory predecessors (TrainConfig.predecessor_pulls, issue 19): the round's steps in chunks, the
predecessors' working weights pulled between them within a bound, in one process and in real daemons."""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import replace

import pytest
import torch
from swarm_utils import daemon_config, link_static, memory_swarm, running, tiny_model, trajectory_config

from swarmd.averaging.state import merge_train_stats, weights_hash
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.local_run import BlockStack, LocalRun
from swarmd.core.pipeline import pipeline_trains
from swarmd.core.train import average_embeddings, split_steps
from swarmd.node.peers import pull_predecessors, refresh_predecessors, within_drift
from swarmd.transport import PeerClient
from swarmd.v1 import swarm_pb2 as pb

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("steps", "parts", "chunks"),
    [(10, 4, [3, 3, 2, 2]), (100, 4, [25] * 4), (3, 8, [1, 1, 1]), (7, 1, [7]), (0, 3, [0])],
)
def test_split_steps(steps, parts, chunks):
    assert split_steps(steps, parts) == chunks


def test_merge_train_stats_weights_ce_by_samples():
    a = {"ce": 2.0, "samples": 30, "seconds": 1.0, "samples_per_s": 30.0}
    b = {"ce": 4.0, "samples": 10, "seconds": 1.0, "samples_per_s": 10.0}
    merged = merge_train_stats([a, b, {"ce": float("nan"), "samples": 0, "seconds": 0.0, "samples_per_s": 0.0}])
    assert merged == {"ce": 2.5, "samples": 40, "seconds": 2.0, "samples_per_s": 20.0}


def test_predecessor_pulls_must_be_positive():
    with pytest.raises(ValueError, match="predecessor_pulls"):
        TrainConfig(predecessor_pulls=0)


def test_within_drift_bounds_a_working_state_by_our_own_movement():
    merged = {"w": torch.zeros(4, 4), "b": torch.ones(4)}
    near = {"w": torch.full((4, 4), 0.1), "b": torch.ones(4)}  # 0.4 from merged
    assert within_drift(near, merged, own_moved=0.05)  # 0.4 <= 8 x 0.05
    assert not within_drift(near, merged, own_moved=0.04)
    assert not within_drift({"w": torch.full((4, 4), float("nan")), "b": torch.ones(4)}, merged, 1e9)
    assert not within_drift({"w": torch.zeros(4, 4)}, merged, 1.0)  # a tensor missing
    assert not within_drift({"w": torch.zeros(2, 8), "b": torch.ones(4)}, merged, 1.0)  # another shape


def _stack(pulls: int, corpus) -> BlockStack:
    cfg = ModelConfig(blocks=3, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    tcfg = TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, predecessor_pulls=pulls)
    return BlockStack(cfg, tcfg, ByteData.from_path(corpus, cfg.seq_len))


def _chunked_by_hand(stack: BlockStack, chunks: list[int]) -> None:
    """The old round loop, once per chunk: snapshot every block, each trains its chunk against the others."""
    table = stack.trainers[0].emb.normalized().detach().clone()
    for chunk in chunks:
        snap = {i: copy.deepcopy(t.block).eval().requires_grad_(False) for i, t in enumerate(stack.trainers)}
        for b, trainer in enumerate(stack.trainers):
            trainer.set_others({i: blk for i, blk in snap.items() if i != b}, table=table)
            for _ in range(chunk):
                trainer.step(*next(stack.streams[b]))
    average_embeddings([t.emb for t in stack.trainers])


@pytest.mark.parametrize("pulls", [1, 3])
def test_block_stack_refreshes_its_snapshots_pulls_times_a_round(tmp_path, pulls):
    corpus = tmp_path / "train.txt"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 40)
    stack, by_hand = _stack(pulls, corpus), _stack(pulls, corpus)
    stack.train_round(6)
    _chunked_by_hand(by_hand, split_steps(6, pulls))
    for a, b in zip(stack.trainers, by_hand.trainers):
        for (name, p), q in zip(a.block.state_dict().items(), b.block.state_dict().values()):
            assert torch.equal(p, q), name
    # the last chunk ran against block 1 as it was after the earlier chunks, not at round start
    first_chunk_moved = not torch.equal(
        stack.trainers[2].others[1].out.weight, torch.zeros_like(stack.trainers[1].block.out.weight)
    )
    assert first_chunk_moved == (pulls > 1)


@pytest.mark.parametrize("stagger", [1, 2])
def test_a_pipelined_single_process_stack_trains_each_block_in_its_turn(tmp_path, stagger):
    """TrainConfig.pipeline in one process (blocktrain train --pipeline): block b trains `rounds` rounds from
    round b x stagger + 1 on, the run takes (B - 1) x stagger rounds more, and the table is the mean of the blocks
    that trained (an idle block's untrained copy would dilute it)."""
    corpus = tmp_path / "train.txt"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 40)
    cfg = ModelConfig(blocks=3, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    tcfg = TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, pipeline=True, pipeline_stagger=stagger)
    data = ByteData.from_path(corpus, cfg.seq_len)
    eval_xy = data.eval_windows(64)
    steps_seen: list[list[int]] = []
    stack, by_hand = BlockStack(cfg, tcfg, data), BlockStack(cfg, tcfg, data)
    for _ in range(2):  # round 1 by hand: block 0 alone takes its steps
        by_hand.trainers[0].step(*next(by_hand.streams[0]))
    for r in range(1, 2 + tcfg.extra_rounds(cfg.blocks) + 1):
        stack.train_round(2, round_no=r, rounds=2)
        steps_seen.append([t.step_count for t in stack.trainers])
        assert all(torch.equal(t.emb.table, stack.emb.table) for t in stack.trainers)
        if r == 1:  # the table is block 0's, not diluted by the idle blocks' untrained copies
            assert torch.equal(stack.emb.table, by_hand.trainers[0].emb.table)
    expected = [
        [2 * sum(pipeline_trains(q, b, 2, stagger=stagger) for q in range(1, r + 1)) for b in range(3)]
        for r in range(1, len(steps_seen) + 1)
    ]
    assert steps_seen == expected and steps_seen[-1] == [4, 4, 4] and len(steps_seen) == 2 + 2 * stagger
    reports = []
    trained = LocalRun(cfg, tcfg, data, eval_xy, 2, 2, on_round=reports.append).blocktrain()
    assert [t.step_count for t in trained.trainers] == [4, 4, 4] and len(reports) == 2 + 2 * stagger
    assert reports[-1].steps_per_block == 4


def test_a_warm_started_block_begins_as_its_trained_predecessor_with_a_zero_output(tmp_path):
    """TrainConfig.block_init "predecessor": at its first turn block 1 takes block 0's trunk as block 0 then stands
    (not its seeded init), its output layer and message input at 0, so it starts as the identity on block 0's
    estimate; block 2 waits for its own turn; anything else but fresh/predecessor is refused."""
    corpus = tmp_path / "train.txt"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 40)
    cfg = ModelConfig(blocks=3, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16, pred_in_init="zero")
    tcfg = TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, pipeline=True, pipeline_stagger=1)
    stack = BlockStack(cfg, replace(tcfg, block_init="predecessor"), ByteData.from_path(corpus, cfg.seq_len))
    fresh = copy.deepcopy(stack.trainers[2].block.state_dict())
    stack.train_round(2, round_no=1, rounds=2)  # block 0 alone
    block0 = copy.deepcopy(stack.trainers[0].block.state_dict())
    stack.train_round(0, round_no=2, rounds=2)  # block 1's turn begins (no steps taken yet)
    block1 = stack.trainers[1].block.state_dict()
    for name, value in block1.items():
        if name.split(".")[0] in ("out", "pred_in"):
            assert not value.any(), name
        else:
            assert torch.equal(value, block0[name]), name
    assert all(torch.equal(v, fresh[k]) for k, v in stack.trainers[2].block.state_dict().items())
    stack.train_round(1, round_no=2, rounds=2)
    assert stack.trainers[1].block.out.weight.any()  # the output layer trains from 0
    with pytest.raises(ValueError, match="block_init"):
        TrainConfig(block_init="copy")


def test_daemons_pull_their_predecessors_working_weights_mid_round(tmp_path):
    async def scenario():
        configs = [trajectory_config(tmp_path, b, predecessor_pulls=2) for b in range(3)]
        configs = [replace(c, gossip=replace(c.gossip, pull_codec="fp32")) for c in configs]  # fp16 working pulls
        async with running(*configs) as daemons:
            addresses = [d.server.address for d in daemons]
            link_static(daemons)
            last = daemons[2]
            assert await last.load_predecessors() == 2
            merged = {b: dict(last.state.predecessors[b]) for b in (0, 1)}
            for d in daemons:  # every block takes steps this round (two chunks each: no predecessors to refresh
                await d.train(2)  # for block 0; block 1's and 2's refreshes run as the daemon does)
            working = {b: daemons[b].state.current()[0] for b in (0, 1)}
            refreshed = await refresh_predecessors(last.gossip, last.state, await last.records())
            # the PullState answer itself: the working weights, signed, hashing to what its header names
            client = PeerClient()
            try:
                request = pb.PullStateRequest(
                    swarm_id="test",
                    config_hash=last.cfg.config_hash(),
                    kind=pb.PAYLOAD_KIND_BLOCK_STATE,
                    block_index=0,
                    working=True,
                )
                enc = await client.pull_state(addresses[0], request, 5.0)
            finally:
                await client.close()
            return refreshed, merged, working, last, enc, daemons[0].peer_id

    refreshed, merged, working, last, enc, peer0 = asyncio.run(scenario())
    assert refreshed == 2
    others = last.state.trainer.others
    for b in (0, 1):
        assert any(not torch.equal(working[b][k], merged[b][k]) for k in merged[b])  # they moved this round
        for k, v in working[b].items():  # ... and the block-2 peer now runs them as they are
            assert torch.allclose(others[b].state_dict()[k], v, rtol=1e-3, atol=1e-6)  # fp16 on the wire
        assert all(p.grad is None and not p.requires_grad for p in others[b].parameters())
    assert enc.header.peer_id == peer0 and enc.header.base_hash == weights_hash(working[0])
    assert last.state.predecessors is not None and set(last.state.predecessors) == {0, 1}  # the bound's reference


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_prefetched_pull_runs_while_the_chunk_before_it_ends_and_its_weights_run_from_the_next(tmp_path, prefetch):
    """TrainConfig.prefetch_pulls: the pull for chunk 2 starts halfway through chunk 1 and the steps go on while it
    is in flight (the pull here answers only once a later step was taken); without it the steps stop at the
    chunk's end until the pull is in. Either way chunk 2 runs the pulled weights."""

    async def scenario():
        configs = [
            trajectory_config(tmp_path, b, blocks=2, predecessor_pulls=2, prefetch_pulls=prefetch) for b in (0, 1)
        ]
        configs = [replace(c, gossip=replace(c.gossip, pull_codec="fp32")) for c in configs]
        async with running(*configs) as daemons:
            link_static(daemons)
            last = daemons[1]
            assert await last.load_predecessors() == 1
            await daemons[0].train(3)  # block 0 moved: its working weights are what a mid-round pull gets
            working = daemons[0].state.current()[0]
            real, at, asked = last.gossip.fetch_working, [], threading.Event()
            before = last.state.trainer.step_count

            async def fetch(*args, **kwargs):
                at.append(last.state.trainer.step_count)
                asked.set()
                if prefetch:  # answer only once the chunk's second half took a step: the steps did not wait
                    async with asyncio.timeout(30):
                        while last.state.trainer.step_count <= at[0]:
                            await asyncio.sleep(0.01)
                return await real(*args, **kwargs)

            def gated(batches):  # with prefetch, the second half's first step waits until the pull was asked for
                for batch in batches:
                    if prefetch and last.state.trainer.step_count == before + 1:
                        assert asked.wait(30)
                    yield batch

            last.gossip.fetch_working = fetch
            last.batches = gated(last.batches)
            await last.train(4)
            return at, before, last, working

    at, before, last, working = asyncio.run(scenario())
    assert at == [before + (1 if prefetch else 2)]  # halfway through chunk 1 (2 steps), or at its end
    assert last.state.trainer.step_count == before + 4
    for k, v in working.items():  # chunk 2 ran block 0's working weights as pulled
        assert torch.allclose(last.state.trainer.others[0].state_dict()[k], v, rtol=1e-3, atol=1e-6)


def test_a_round_without_predecessors_refreshes_nothing(tmp_path):
    cfg = daemon_config(tmp_path, 1, blocks=3, seed=0, discovery="static")
    cfg = replace(cfg, train=replace(cfg.train, trajectory_prob=1.0, predecessor_pulls=4))

    async def scenario():
        async with running(cfg) as (d,):
            assert await d.load_predecessors() == 0
            refreshed = await refresh_predecessors(d.gossip, d.state, await d.records())
            await asyncio.wait_for(d.run_round(), 60)
            return refreshed, d

    refreshed, d = asyncio.run(scenario())
    assert refreshed == 0 and d.state.round == 1 and d.state.trainer.train_cfg.trajectory_prob == 0.0


@pytest.mark.parametrize(
    ("round_no", "block", "train_rounds", "start", "trains"),
    [
        (1, 0, 3, 0, True),
        (3, 0, 3, 0, True),
        (4, 0, 3, 0, False),  # block 0 is done after its 3 rounds and waits for the others
        (1, 2, 3, 0, False),  # block 2 starts 2 rounds late ...
        (3, 2, 3, 0, True),
        (5, 2, 3, 0, True),  # ... and ends in round 3 + 2
        (6, 2, 3, 0, False),
        (100, 1, 0, 0, True),  # without an end
        (11, 1, 3, 10, False),  # a run resumed at round 10
        (12, 1, 3, 10, True),
    ],
)
def test_pipeline_trains(round_no, block, train_rounds, start, trains):
    from swarmd.core.pipeline import pipeline_trains

    assert pipeline_trains(round_no, block, train_rounds, start) is trains


@pytest.mark.parametrize(
    ("round_no", "block", "trains"), [(4, 1, False), (5, 1, True), (8, 1, True), (9, 1, False), (9, 2, True)]
)
def test_a_staggered_pipeline_starts_each_block_s_rounds_after_the_one_before(round_no, block, trains):
    from swarmd.core.pipeline import pipeline_trains

    assert pipeline_trains(round_no, block, 4, 0, stagger=4) is trains  # sequential: 4 rounds each, in turn


@pytest.mark.parametrize(
    ("stagger", "steps"), [(1, {0: [2, 4, 4], 1: [0, 2, 4]}), (2, {0: [2, 4, 4, 4], 1: [0, 0, 2, 4]})]
)
def test_pipelined_daemons_start_late_run_b_minus_1_rounds_more_and_take_equal_steps(tmp_path, stagger, steps):
    """--pipeline-stagger S: block 1 starts S rounds after block 0; everyone runs (B - 1) x S rounds more (S = the
    rounds: one block after the other)."""

    def config(block):
        cfg = trajectory_config(tmp_path, block, blocks=2, max_rounds=2, pipeline=True, predecessor_pulls=4)
        return replace(cfg, train=replace(cfg.train, pipeline_stagger=stagger))

    steps_after_round: dict[int, list[int]] = {0: [], 1: []}
    tables: dict[int, list[str]] = {0: [], 1: []}

    def on_round(d):
        steps_after_round[d.state.block_index].append(d.state.local_steps)
        tables[d.state.block_index].append(d.state.emb_hash)

    async def scenario():
        async with running(config(0), config(1)) as daemons:
            link_static(daemons)
            for d in daemons:
                d.on_round = lambda report, d=d: on_round(d)
            await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 90)
            return daemons

    d0, d1 = asyncio.run(scenario())
    assert d0.state.round == d1.state.round == 2 + stagger  # 2 rounds each, block 1 `stagger` rounds late
    assert steps_after_round == steps
    # one byte table after every round (the idle peer lands the trainer's table step), moving while a block trains
    assert tables[0] == tables[1] and len(set(tables[0])) == 2 + stagger
    # each record carries its block's window, so a peer sitting a round out waits for the one that trains it
    windows = [(r.train_first, r.train_last) for r in (d.gossip.record() for d in (d0, d1))]
    assert windows == [(1, 2), (1 + stagger, 2 + stagger)]


def test_a_predecessor_nobody_serves_keeps_the_state_pulled_before():
    """A trajectory-trained block whose predecessors' peers left (a pipelined swarm's ended blocks) runs the states
    it pulled in an earlier round, not a round of noisy targets; a block never pulled still means noisy targets."""
    peers, _, _ = memory_swarm([2], blocks=3)
    cfg = tiny_model(3)
    held = {b: {"w": torch.full((2,), float(b))} for b in (0, 1)}
    kept = asyncio.run(pull_predecessors(peers[0], [], cfg, 2, held))
    assert kept is not None and sorted(kept) == [0, 1] and all(kept[b] is held[b] for b in (0, 1))
    assert asyncio.run(pull_predecessors(peers[0], [], cfg, 2, {0: held[0]})) is None
    assert asyncio.run(pull_predecessors(peers[0], [], cfg, 2)) is None


def test_a_sequential_swarm_warm_starts_block_1_from_block_0_s_merged_state_once(tmp_path):
    """TrainConfig.block_init "predecessor" in daemons: at the first round of its turn block 1's peer makes its base
    and live block its predecessor's round-start merged state (output layer at 0, message input at its init), once;
    block 0 never does; the swarm trains on and ends with both blocks on one table."""

    def config(block):
        cfg = trajectory_config(tmp_path, block, blocks=2, max_rounds=2, pipeline=True, predecessor_pulls=1)
        return replace(cfg, train=replace(cfg.train, pipeline_stagger=2, block_init="predecessor"))

    starts: list[tuple[int, int, bool, dict, dict]] = []

    def spy(d):
        original = d.state.warm_start

        def warm_start():
            done = original()
            _, block, _ = d.state.snapshot()
            starts.append((d.state.block_index, d.state.round, done, block, dict(d.state.predecessors or {})))
            return done

        d.state.warm_start = warm_start

    async def scenario():
        async with running(config(0), config(1)) as daemons:
            link_static(daemons)
            for d in daemons:
                spy(d)
            await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 90)
            return daemons

    d0, d1 = asyncio.run(scenario())
    assert d0.state.round == d1.state.round == 4 and d1.state.local_steps == d0.state.local_steps
    assert [(b, r) for b, r, done, _, _ in starts if done] == [(1, 2)]  # round 3's start, block 1 only
    assert all(not done for b, _, done, _, _ in starts if b == 0)  # block 0 has no predecessor to start from
    _, _, _, block, predecessors = next(s for s in starts if s[2])
    for name, value in block.items():
        if name.startswith("out."):
            assert not value.any(), name
        elif name.startswith("pred_in."):
            expected = torch.eye(value.shape[0]) if name.endswith("weight") else torch.zeros_like(value)
            assert torch.equal(value, expected), name
        else:
            assert torch.equal(value, predecessors[0][name]), name
    assert d0.state.emb_hash == d1.state.emb_hash
