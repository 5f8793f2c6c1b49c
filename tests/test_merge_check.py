"""swarmd.averaging.merge's loss check (issue 21, Zeno): honest merges untouched, a signed poisoning majority refused,
deterministic verdicts, and the probation / left-out seam. Real HeldOutCheck scores on the tiny model."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch
from swarm_utils import TEXT, batches, memory_round, memory_swarm, tiny_model, tiny_train

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.merge import IDLE_SLACK, Landing, check_merge, merge_deltas
from swarmd.averaging.validation import HeldOutCheck
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData, load_bytes
from swarmd.core.model import denoise
from swarmd.core.train import BlockTrainer, init_block, init_embedding, trajectory_inputs

Tensors = dict[str, torch.Tensor]
CFG = GossipConfig(steps_per_round=4, codec="fp32")  # the default robust merge, tolerance 0.02 nats


def sample(block_index: int = 0) -> HeldOutCheck:
    """The held-out sample a peer of block `block_index` draws from TEXT (what the daemon builds)."""
    cfg = tiny_model()
    return HeldOutCheck.from_data(ByteData(np.frombuffer(TEXT, dtype=np.uint8), cfg.seq_len), cfg, block_index)


def trained_deltas(n: int, steps: int = 4) -> tuple[dict[str, Tensors], list[dict[str, Tensors]]]:
    """(the shared base of block 0 as kind -> weights, n honest kind -> delta dicts of `steps` local steps each)."""
    cfg, out = tiny_model(), []
    base: dict[str, Tensors] = {}
    for i in range(n):
        trainer = BlockTrainer(cfg, tiny_train(), 0, worker_seed=i)
        start = {BLOCK: trainer.block.state_dict(), EMB: trainer.emb.state_dict()}
        start = {k: {n: v.detach().clone() for n, v in sd.items()} for k, sd in start.items()}
        base = base or start
        stream = batches(i)
        for _ in range(steps):
            trainer.step(*next(stream))
        live = {BLOCK: trainer.block.state_dict(), EMB: trainer.emb.state_dict()}
        out.append({k: {n: live[k][n].detach().float() - start[k][n] for n in start[k]} for k in (BLOCK, EMB)})
    return base, out


def inbox_of(ids: list[str], deltas: list[dict[str, Tensors]]) -> dict[str, dict[str, Tensors]]:
    """Same-block peers: each id sends its block and byte-table delta."""
    return {kind: {pid: d[kind] for pid, d in zip(ids, deltas)} for kind in (BLOCK, EMB)}


def plain(me: str, own: dict[str, Tensors], inbox: dict[str, dict[str, Tensors]], skip: set[str] = frozenset()):
    """The merge without any check over own + the inbox minus `skip`, per kind."""
    return {
        kind: merge_deltas({me: own[kind], **{p: d for p, d in inbox[kind].items() if p not in skip}}, CFG)
        for kind in (BLOCK, EMB)
    }


def same_bits(a: dict[str, Tensors], b: dict[str, Tensors]) -> bool:
    return all(torch.equal(a[kind][n], b[kind][n]) for kind in (BLOCK, EMB) for n in a[kind])


@pytest.fixture(scope="module")
def honest():
    base, deltas = trained_deltas(4)
    return Landing(base, {BLOCK: None, EMB: None}), deltas


def test_an_honest_merge_passes_untouched(honest):
    landing, (own, *others) = honest
    inbox = inbox_of(["p1", "p2", "p3"], others)
    check = sample()
    out = check_merge("p0", own, inbox, CFG, check, landing)
    assert not out.fell_back and out.scores == 3 and not out.passed and not out.failed
    assert out.candidate_ce <= out.bound_ce and math.isfinite(out.own_ce) and out.base_ce > out.own_ce
    assert same_bits(out.parts, plain("p0", own, inbox))  # bit-identical to no check at all
    assert out.merged_from[BLOCK] == ("p0", "p1", "p2", "p3")
    unchecked = check_merge("p0", own, inbox, CFG, None, landing)
    assert same_bits(unchecked.parts, out.parts) and unchecked.scores == 0 and math.isnan(unchecked.own_ce)


def poison(landing: Landing, honest_delta: dict[str, Tensors], factor: float = -8.0) -> dict[str, Tensors]:
    """A large step against the descent direction (raises the loss), well under the norm bound."""
    return {kind: {n: factor * v for n, v in honest_delta[kind].items()} for kind in (BLOCK, EMB)}


def test_a_poisoning_majority_is_refused_and_the_honest_deltas_kept(honest):
    landing, (own, other, *_) = honest
    bad = poison(landing, other)
    ids = ["p1", "p2", "p3", "p4"]  # p1 honest; p2-p4: three signed identities, the same poisoned step
    inbox = inbox_of(ids, [other, bad, bad, bad])
    check = sample()
    unchecked = check_merge("p0", own, inbox, CFG, None, landing)
    poisoned_ce = check.score(*landing.weights(unchecked.parts))
    out = check_merge("p0", own, inbox, CFG, check, landing)
    assert out.fell_back and out.candidate_ce == poisoned_ce  # the robust rule alone lands the poison ...
    assert poisoned_ce > out.own_ce + 0.5
    assert out.failed == {"p2", "p3", "p4"} and out.passed == {"p1"}  # ... the check refuses it, keeps p1's
    assert same_bits(out.parts, plain("p0", own, inbox, skip={"p2", "p3", "p4"}))
    assert out.merged_from == {BLOCK: ("p0", "p1"), EMB: ("p0", "p1")}
    assert out.landed_ce <= out.bound_ce
    assert out.scores == 3 + 4 + 1  # own, base, candidate, one per peer, the fallback merge


def test_other_block_peers_are_judged_on_their_byte_table_delta_merged_with_ours(honest):
    landing, (own, other, *_) = honest
    bad = poison(landing, other)
    inbox = {BLOCK: {}, EMB: {"q1": other[EMB], "q2": bad[EMB], "q3": bad[EMB], "q4": bad[EMB]}}
    check = sample()
    out = check_merge("p0", own, inbox, CFG, check, landing)
    assert out.fell_back and out.failed == {"q2", "q3", "q4"} and out.passed == {"q1"}
    assert out.merged_from == {BLOCK: ("p0",), EMB: ("p0", "q1")}
    assert all(torch.equal(out.parts[BLOCK][n], own[BLOCK][n]) for n in own[BLOCK])  # our block delta alone
    # the verdict is that of our block delta with the pair's table merge (as the round lands it), not of their
    # table delta in place of ours: each block tunes the table to its own noise levels
    for pid in ("q1", "q2"):
        pair = merge_deltas({"p0": own[EMB], pid: inbox[EMB][pid]}, CFG)
        expected = check.score(*landing.weights({BLOCK: own[BLOCK], EMB: pair})) <= out.bound_ce
        assert (pid in out.passed) == expected


def test_verdicts_are_deterministic_for_the_same_accepted_set(honest):
    landing, (own, other, *_) = honest
    bad = poison(landing, other, factor=-3.0)
    inbox = inbox_of(["p1", "p2", "p3"], [other, bad, bad])
    first = check_merge("p0", own, inbox, CFG, sample(), landing)
    # another replica's sample of the same block and text, the inbox in another insertion order
    shuffled = {kind: dict(reversed(list(inbox[kind].items()))) for kind in (BLOCK, EMB)}
    second = check_merge("p0", own, shuffled, CFG, sample(), landing)
    assert (first.candidate_ce, first.own_ce, first.landed_ce) == (second.candidate_ce, second.own_ce, second.landed_ce)
    assert (first.passed, first.failed, first.fell_back) == (second.passed, second.failed, second.fell_back)
    assert same_bits(first.parts, second.parts)


def test_probation_peers_count_only_when_they_pass_one_by_one(honest):
    landing, (own, a, b, c) = honest
    flipped = poison(landing, c, factor=-1.0)  # a minority: the robust merge's candidate passes with it
    inbox = inbox_of(["p1", "p2", "p3"], [a, b, flipped])
    check = sample()
    assert not check_merge("p0", own, inbox, CFG, check, landing).fell_back
    out = check_merge("p0", own, inbox, CFG, check, landing, must_pass={"p2", "p3"})
    assert not out.fell_back and out.passed == {"p2"} and out.failed == {"p3"}  # p1 is not on probation: unscored
    assert same_bits(out.parts, plain("p0", own, inbox, skip={"p3"}))
    assert out.scores == 3 + 2
    # no sample, no pass: probation deltas do not count
    blind = check_merge("p0", own, inbox, CFG, None, landing, must_pass={"p2"})
    assert blind.left_out == {"p2"} and same_bits(blind.parts, plain("p0", own, inbox, skip={"p2"}))


def test_left_out_peers_do_not_count_and_are_not_scored(honest):
    landing, (own, a, b, _) = honest
    inbox = inbox_of(["p1", "p2"], [a, b])
    out = check_merge("p0", own, inbox, CFG, sample(), landing, leave_out={"p2", "p9"})
    assert out.left_out == {"p2"} and out.scores == 3 and not out.passed and not out.failed
    assert same_bits(out.parts, plain("p0", own, inbox, skip={"p2"}))
    assert out.merged_from[EMB] == ("p0", "p1")


def test_the_outer_step_is_previewed_exactly_without_moving_its_buffers():
    async def scenario():
        peers, _, board = memory_swarm([0, 0], codec="fp32", outer="nesterov")
        for g in peers:
            g.check = sample(0)
        await memory_round(peers, board)  # the buffers hold a round's momentum now
        return peers

    g = asyncio.run(scenario())[0]
    assert g.metrics.merge_checks == 1
    buffers = {part: {n: t.clone() for n, t in g.state.outer.buffers[part].items()} for part in ("block", "emb")}
    step = {n: 1e-3 * torch.ones_like(t) for n, t in g.state.base_block.items()}
    landing = Landing.of(g)
    predicted = [landing.part(BLOCK, step) for _ in range(2)]  # previews: the same, and the buffers stay
    assert all(torch.equal(predicted[0][n], predicted[1][n]) for n in step)
    for part in ("block", "emb"):
        assert all(torch.equal(t, buffers[part][n]) for n, t in g.state.outer.buffers[part].items())
    g.state.apply_merge(step, None)  # what the merge lands: the previewed weights, bit for bit
    assert all(torch.equal(g.state.base_block[n], predicted[0][n]) for n in step)
    assert not all(torch.equal(predicted[0][n], landing.base[BLOCK][n] + step[n]) for n in step)  # not plain


def swarm_round(blocks_of: list[int], insiders: set[int], check: bool) -> tuple[list, list, dict[int, dict]]:
    """One round of a memory swarm (signed payloads, norm bound, robust merge): the honest peers train 4 steps;
    the insiders (their indices) all send the same step against the first honest peer's descent direction
    (-8 x its delta, block and byte table; signed, under the norm bound). With `check`, each honest peer holds
    its block's sample. Returns (peers, reports, honest peer index -> the base the honest deltas alone give)."""

    async def scenario():
        peers, _, board = memory_swarm(blocks_of, codec="fp32")
        honest = [i for i in range(len(peers)) if i not in insiders]
        if check:
            for i in honest:
                peers[i].check = sample(peers[i].me.block_index)
        records = list(board.values())
        for g in peers:
            await g.open_round()
        deltas = {}
        for i in honest:
            await asyncio.to_thread(peers[i].state.train_steps, 4, batches(i))
            deltas[i] = dict(zip((BLOCK, EMB), await asyncio.to_thread(peers[i].state.deltas)))
        bad = {kind: {n: -8.0 * v for n, v in deltas[honest[0]][kind].items()} for kind in (BLOCK, EMB)}
        for i in insiders:  # live := base + the poisoned step (the same bits for every insider)
            g = peers[i]
            for module, base, delta in (
                (g.state.trainer.block, g.state.base_block, bad[BLOCK]),
                (g.state.trainer.emb, g.state.base_emb, bad[EMB]),
            ):
                params = module.state_dict()
                with torch.no_grad():
                    for name, v in delta.items():
                        params[name].copy_(base[name] + v)
        bases = {i: {BLOCK: dict(peers[i].state.base_block), EMB: dict(peers[i].state.base_emb)} for i in honest}
        reports = await asyncio.gather(*(g.average(records) for g in peers))
        expected = {}
        for i in honest:  # the robust merge over the honest deltas this peer's part takes
            same = [j for j in honest if blocks_of[j] == blocks_of[i]]
            parts = {
                BLOCK: merge_deltas({peers[j].me.peer_id: deltas[j][BLOCK] for j in same}, peers[i].cfg),
                EMB: merge_deltas({peers[j].me.peer_id: deltas[j][EMB] for j in honest}, peers[i].cfg),
            }
            expected[i] = {k: {n: bases[i][k][n] + parts[k][n] for n in parts[k]} for k in (BLOCK, EMB)}
        return peers, reports, expected

    return asyncio.run(scenario())


def lands(g, expected: dict[str, Tensors]) -> bool:
    """Whether the peer's new base is `expected`, bit for bit."""
    return all(torch.equal(g.state.base_block[n], t) for n, t in expected[BLOCK].items()) and all(
        torch.equal(g.state.base_emb[n], t) for n, t in expected[EMB].items()
    )


def test_an_honest_swarm_round_passes_untouched():
    peers, reports, expected = swarm_round([0, 0, 1], set(), check=True)
    assert not any(r.fell_back or r.refused or r.passed for r in reports) and all(r.check_s > 0 for r in reports)
    assert all(lands(g, expected[i]) for i, g in enumerate(peers))  # the plain robust merge, bit for bit
    assert peers[0].state.block_hash == peers[1].state.block_hash
    assert len({g.state.emb_hash for g in peers}) == 1
    assert all(g.metrics.merge_checks == 1 and g.metrics.merge_fallbacks == 0 for g in peers)


def test_signed_insiders_in_the_majority_are_refused_on_the_wire():
    insiders = {1, 2, 4}  # three signed identities against two honest peers of block 0
    peers, reports, expected = swarm_round([0] * 5, insiders, check=True)
    honest = [0, 3]
    insider_ids = {peers[i].me.peer_id for i in insiders}
    for i in honest:
        g, report = peers[i], reports[i]
        assert insider_ids <= set(report.accepted_block)  # signed, under the norm bound: accepted on the wire ...
        assert report.fell_back and set(report.refused) == insider_ids  # ... and refused by the loss check
        assert report.passed == [peers[j].me.peer_id for j in honest if j != i]
        assert lands(g, expected[i])  # own + the other honest delta, bit for bit
        assert g.metrics.merge_fallbacks == 1 and g.metrics.merge_refused == 3
    assert peers[0].state.block_hash == peers[3].state.block_hash  # the honest replicas still agree
    # without the check the same round lands the poison (so this test can fail)
    unchecked, _, _ = swarm_round([0] * 5, insiders, check=False)
    check = sample(0)
    ce = [check.score(g.state.base_block, g.state.base_emb) for g in (peers[0], unchecked[0])]
    assert ce[1] > ce[0] + 0.5


def test_an_anchored_part_is_scored_where_it_lands_and_an_infinite_tolerance_turns_the_check_off(honest):
    landing, (own, a, *_) = honest
    anchor = {n: v + 0.01 for n, v in landing.base[BLOCK].items()}
    anchored = Landing(landing.base, {BLOCK: anchor, EMB: None})
    block, emb = anchored.weights({BLOCK: own[BLOCK], EMB: None})
    assert all(torch.equal(block[n], anchor[n] + own[BLOCK][n]) for n in own[BLOCK])  # the anchor + merged offsets
    assert all(torch.equal(emb[n], landing.base[EMB][n]) for n in emb)  # None: the base is kept
    inbox = inbox_of(["p1"], [poison(landing, a)])
    off = GossipConfig(steps_per_round=4, codec="fp32", merge_check_tolerance=math.inf)
    out = check_merge("p0", own, inbox, off, sample(), landing)
    assert out.scores == 0 and not out.fell_back and out.merged_from[BLOCK] == ("p0", "p1")


def test_a_later_block_is_scored_on_the_trajectory_it_trains_on(text_data):
    """With the round's predecessors given, the check scores block 1 on the sampler's trajectory through them
    (trajectory_inputs + the predecessor's message, fixed noise): the same float as that computed by hand, the same
    every time; None goes back to the documented noisy targets. And what it scores is what training lowers: a
    block 1 trained on the trajectory scores lower on it after training than before."""

    torch.manual_seed(0)
    cfg = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=64, seq_len=16)
    data = ByteData(load_bytes(text_data / "train.txt")[:50_000], cfg.seq_len)
    check = HeldOutCheck.from_data(data, cfg, 1, seed=0, sequences=8)
    pred = init_block(cfg, 0, 0)
    emb = init_embedding(cfg, 0)
    trainer = BlockTrainer(cfg, TrainConfig(batch_size=8, warmup_steps=2, lr=3e-3), 1)
    trainer.set_others({0: pred}, table=emb)
    block = {k: v.clone() for k, v in trainer.block.state_dict().items()}
    table = {k: v.clone() for k, v in trainer.emb.state_dict().items()}
    documented = check.score(block, table)
    check.use_predecessors({0: pred.state_dict()}, emb.normalized())
    before = check.score(block, table)
    assert before == check.score(block, table) and before != documented
    with torch.no_grad():
        scratch = init_block(cfg, 1, 0).eval()
        scratch.load_state_dict(block)
        gen = torch.Generator().manual_seed(check.noise_seed)
        z, message = trajectory_inputs(
            {0: pred.eval(), 1: scratch}, emb.normalized(), check.x, check.sigma, cfg, 1, gen
        )
        logits = denoise(scratch, trainer.emb.normalized(), check.x, z, check.sigma, pred=message)[0]
        by_hand = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), check.y.flatten()))
    assert before == pytest.approx(by_hand, abs=1e-6)
    batches = data.stream(7, 8)
    for _ in range(40):
        trainer.step(*next(batches))
    assert check.score(trainer.block.state_dict(), trainer.emb.state_dict()) < before - 0.1
    check.use_predecessors(None)
    assert check.score(block, table) == documented


def test_a_peer_that_trained_nothing_lands_the_trainers_merge_and_still_refuses_a_wreck(honest):
    """own_counts False (a pipelined peer's idle round, own delta zero): the trainers' deltas are merged without
    our zeros, and the check only keeps out what would wreck our block (base CE + IDLE_SLACK)."""
    landing, (_, a, b, c) = honest
    zero = {kind: {n: torch.zeros_like(v) for n, v in a[kind].items()} for kind in (BLOCK, EMB)}
    inbox = inbox_of(["p1", "p2", "p3"], [a, b, poison(landing, c)])
    check = sample()
    out = check_merge("p0", zero, inbox, CFG, check, landing, must_pass={"p3"}, own_counts=False)
    assert out.own_ce == out.base_ce and out.bound_ce == pytest.approx(out.base_ce + IDLE_SLACK)
    assert out.failed == {"p3"} and out.merged_from == {BLOCK: ("p1", "p2"), EMB: ("p1", "p2")}
    assert same_bits(out.parts, {kind: merge_deltas({"p1": a[kind], "p2": b[kind]}, CFG) for kind in (BLOCK, EMB)})
    # nothing but our zeros: the base is kept
    alone = check_merge("p0", zero, {BLOCK: {}, EMB: {}}, CFG, check, landing, own_counts=False)
    assert alone.merged_from == {BLOCK: ("p0",), EMB: ("p0",)} and same_bits(alone.parts, zero)
