"""The outer optimizer (swarmd.averaging.outer): Nesterov by hand, identical replicas, checkpoint, reset, plumbing."""

from __future__ import annotations

import asyncio

import pytest
import torch
from swarm_utils import batches, memory_round, memory_swarm, tiny_model, tiny_train

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.outer import OuterOptimizer, make_outer, split_momentum, with_momentum
from swarmd.averaging.state import BlockState, relative_distance, weights_hash
from swarmd.core.data import ByteData, load_bytes
from swarmd.core.train import BlockTrainer
from swarmd.errors import ConfigError, ValidationError
from swarmd.node.config import DaemonConfig
from swarmd.protocol import PayloadKind
from swarmd.sim.engine import SimConfig, Simulator
from swarmd.sim.policies import Lockstep
from swarmd.sim.regimes import regime_named

pytestmark = pytest.mark.usefixtures("one_thread")


def t(*values) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values, dtype=torch.float32)}


def test_nesterov_step_by_hand():
    opt = OuterOptimizer(lr=0.5, momentum=0.9)
    # round 1: buf = d1 = [1, -2]; update = 0.5 * (d1 + 0.9 * buf) = 0.5 * 1.9 * d1
    u1 = opt.step("block", t(1.0, -2.0))
    assert torch.allclose(u1["w"], torch.tensor([0.95, -1.9]))
    # round 2: buf = 0.9 * [1, -2] + [3, 0] = [3.9, -1.8]; update = 0.5 * ([3, 0] + 0.9 * buf)
    u2 = opt.step("block", t(3.0, 0.0))
    assert torch.allclose(opt.buffers["block"]["w"], torch.tensor([3.9, -1.8]))
    assert torch.allclose(u2["w"], 0.5 * (torch.tensor([3.0, 0.0]) + 0.9 * torch.tensor([3.9, -1.8])))
    # the same as torch.optim.SGD(nesterov=True) on the pseudo-gradient -merged
    p = torch.nn.Parameter(torch.zeros(2))
    sgd = torch.optim.SGD([p], lr=0.5, momentum=0.9, nesterov=True)
    for d in (t(1.0, -2.0), t(3.0, 0.0)):
        p.grad = -d["w"]
        sgd.step()
    assert torch.allclose(p.detach(), u1["w"] + u2["w"])
    # parts keep their own buffers; momentum 0 and lr 1 is plain averaging
    assert "emb" not in opt.buffers
    assert torch.equal(OuterOptimizer(1.0, 0.0).step("emb", t(0.25, 4.0))["w"], t(0.25, 4.0)["w"])


def test_make_outer_and_config_validation():
    assert make_outer("none") is None
    assert isinstance(make_outer("nesterov", 0.7, 0.9), OuterOptimizer)
    with pytest.raises(ValueError):
        make_outer("adam")
    with pytest.raises(ValueError):
        OuterOptimizer(0.7, 1.0)
    for bad in ({"outer": "adam"}, {"outer_lr": 0.0}, {"outer_momentum": 1.0}, {"outer_momentum": -0.1}):
        with pytest.raises(ConfigError):
            GossipConfig(**bad)
    cfg = DaemonConfig(gossip=GossipConfig(outer="nesterov", outer_lr=0.5, outer_momentum=0.8, group_size=0))
    assert DaemonConfig.from_dict(cfg.to_dict()).gossip == cfg.gossip


def _state(seed: int, outer: OuterOptimizer | None = None) -> BlockState:
    return BlockState(BlockTrainer(tiny_model(), tiny_train(), 0, worker_seed=seed), outer)


def test_replicas_that_apply_the_same_merges_stay_bit_identical():
    a, b = _state(0, make_outer("nesterov")), _state(1, make_outer("nesterov"))
    assert a.block_hash == b.block_hash  # same block seed: replicas start equal
    streams = [batches(0), batches(1)]
    for _ in range(3):
        for s, stream in zip((a, b), streams, strict=True):
            s.train_steps(2, stream)
        (da, ea), (db, eb) = a.deltas(), b.deltas()
        merged_block = {k: (da[k] + db[k]) / 2 for k in da}
        merged_emb = {k: (ea[k] + eb[k]) / 2 for k in ea}
        before = dict(a.base_block)
        for s in (a, b):
            s.apply_merge(merged_block, merged_emb)
        assert a.block_hash == b.block_hash and a.emb_hash == b.emb_hash
        assert weights_hash(a.outer.buffers["block"]) == weights_hash(b.outer.buffers["block"])
    # the base moved by the outer step, not by the plain merged delta
    plain = {k: before[k] + merged_block[k] for k in before}
    assert weights_hash(plain) != a.block_hash


def test_momentum_checkpoint_round_trip(tmp_path):
    a = _state(0, make_outer("nesterov"))
    a.train_steps(2, batches(0))
    block, emb = a.deltas()
    a.apply_merge(block, emb)
    a.save(tmp_path / "ck")
    b = _state(0, make_outer("nesterov"))
    b.restore(tmp_path / "ck")
    assert b.round == 1 and b.block_hash == a.block_hash
    for part in ("block", "emb"):
        for k, v in a.outer.buffers[part].items():
            assert torch.equal(b.outer.buffers[part][k], v)
    assert b.trainer.opt.state  # AdamW's state is read from the same file, beside the outer buffers
    # a peer without an outer optimizer resumes from the same checkpoint (the buffers are ignored) ...
    _state(0).restore(tmp_path / "ck")
    # ... and one with it from a checkpoint without buffers starts them at zero
    plain = _state(0)
    plain.save(tmp_path / "plain")
    c = _state(0, make_outer("nesterov"))
    c.outer.step("block", block)
    c.restore(tmp_path / "plain")
    assert c.outer.buffers == {}


def test_adopt_takes_the_peers_momentum_or_resets_it():
    a = _state(0, make_outer("nesterov"))
    a.train_steps(2, batches(0))
    a.apply_merge(*a.deltas())
    _, block, emb, momentum = a.snapshot_outer()
    assert momentum is not None and set(momentum) == {"block", "emb"}
    b = _state(1, make_outer("nesterov"))
    b.adopt(block, None, a.round, {"block": momentum["block"]})
    assert all(torch.equal(b.outer.buffers["block"][k], v) for k, v in momentum["block"].items())
    b.outer.step("emb", {k: torch.ones_like(v) for k, v in emb.items()})
    b.adopt(None, emb, a.round)  # adopted without a buffer: that part's buffer is reset (the documented rule)
    assert "emb" not in b.outer.buffers and "block" in b.outer.buffers
    # with no outer optimizer there is nothing to send
    assert _state(2).snapshot_outer()[3] is None
    weights, buf = split_momentum(with_momentum(block, momentum["block"]))  # PullState's payload, and back
    assert weights.keys() == block.keys() and buf is not None and buf.keys() == block.keys()
    assert all(torch.equal(buf[k], momentum["block"][k]) for k in block)
    assert split_momentum(block)[1] is None


def test_gossip_re_sync_pulls_the_outer_buffer_with_the_weights():
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 1], codec="fp32", outer="nesterov", group_size=0)
        await memory_round(peers, board)
        lagging = peers[0]
        await memory_round(peers, board, skip={0})  # behind by one round: re-syncs from peer 1
        pulled = await lagging.sync(list(board.values()))
        await memory_round(peers, board)  # the next merge keeps everybody identical: the buffers agree
        return peers, pulled

    peers, pulled = asyncio.run(scenario())
    a, b, c = peers
    assert pulled == ["block", "embedding"]
    assert a.state.block_hash == b.state.block_hash and a.state.emb_hash == b.state.emb_hash == c.state.emb_hash
    for k, v in b.state.outer.buffers["block"].items():
        assert torch.equal(a.state.outer.buffers["block"][k], v)


def test_in_group_mode_each_peer_steps_on_its_own_delta_and_the_mean_follows_diloco():
    """group_size > 0: the outer optimizer is local (each peer sends its own update; merged updates land as they
    are). Linear: with one group and the plain mean, every replica lands DiLoCo's step on the mean delta, and
    the replicas' mean buffer is DiLoCo's buffer; applied twice or not at all, the bases would differ."""

    def run(**gossip):
        torch.manual_seed(0)

        async def scenario():
            peers, _, board = memory_swarm([0, 0, 1], codec="fp32", merge="mean", **gossip)
            for _ in range(2):
                assert all(r.participation == 1.0 for r in await memory_round(peers, board))
            return peers

        return asyncio.run(scenario())

    diloco = run(outer="nesterov", group_size=0)
    grouped = run(outer="nesterov", group_size=4)
    plain = run(group_size=4)
    assert not diloco[0].state.outer.local and grouped[0].state.outer.local
    assert grouped[0].state.block_hash == grouped[1].state.block_hash  # one group: replicas bit-identical
    for a, b, c in zip(grouped, diloco, plain):
        # (round 1 lands within 1e-8; AdamW's second round on bases 1e-8 apart grows that to ~1e-5)
        assert relative_distance(a.state.base_block, b.state.base_block) < 1e-4
        assert relative_distance(a.state.base_emb, b.state.base_emb) < 1e-4
        assert relative_distance(a.state.base_block, c.state.base_block) > 1e-2
    own = [g.state.outer.buffers["block"] for g in grouped[:2]]
    assert relative_distance(own[0], own[1]) > 1e-2  # each peer's buffer is its own ...
    mean = {k: (own[0][k] + own[1][k]) / 2 for k in own[0]}
    assert relative_distance(mean, diloco[0].state.outer.buffers["block"]) < 1e-3  # ... their mean DiLoCo's


def test_outer_updates_in_groups_pass_the_norm_bound_and_keep_groups_consistent():
    """8 replicas in groups of 4 with the outer optimizer, int8 offsets: nothing is rejected (the payload bound
    allows for the outer gain), each group's members land on one base, and the groups differ."""

    async def scenario():
        # each round waits (up to 3 s) for all 8 table deltas: 8 peers in one process on a loaded machine took
        # longer than the policy's 0.2 s floor, and a delta that comes after the close counts as rejected
        peers, _, board = memory_swarm(
            [0] * 8, codec="int8", blocks=2, group_size=4, outer="nesterov", deadline_min_s=3.0
        )
        reports = [await memory_round(peers, board) for _ in range(3)]
        return peers, reports

    peers, reports = asyncio.run(scenario())
    by_id = {g.me.peer_id: g for g in peers}
    kind = PayloadKind.BLOCK_DELTA
    ones = {k: torch.ones_like(v) for k, v in peers[0].state.base_block.items()}
    scale = 2 * peers[0].norm_bound(kind) / float(torch.cat([v.flatten() for v in ones.values()]).norm())
    over = {k: v * scale for k, v in ones.items()}  # 2x the plain bound, within the outer's (gain 0.7 / 0.1 = 7)
    peers[0].check_norm(over, kind)
    plain, _, _ = memory_swarm([0, 0], codec="int8", group_size=4)
    with pytest.raises(ValidationError):
        plain[0].check_norm(over, kind)
    for g, r in zip(peers, reports[-1]):
        assert r.rejected == 0 and len(r.expected_block) == 3
        for m in r.accepted_block:  # (the same values; summation order may differ in the last bit)
            assert relative_distance(by_id[m].state.base_block, g.state.base_block) < 1e-6
    assert max(relative_distance(peers[0].state.base_block, g.state.base_block) for g in peers) > 1e-4


def test_simulator_applies_the_daemons_outer_step(text_data):
    cfg = SimConfig(tiny_model(), tiny_train(), workers=2, rounds=2, steps_per_round=2, eval_tokens=256)
    data = ByteData(load_bytes(text_data / "train.txt")[:50_000], cfg.model.seq_len)
    held_out = ByteData(load_bytes(text_data / "eval.txt")[:10_000], cfg.model.seq_len).eval_windows(256)
    regime = regime_named("lockstep")
    runs = {}
    for outer in ("none", "nesterov"):
        with torch.random.fork_rng(devices=[]):
            sim = Simulator(cfg, regime, Lockstep(), data, held_out, gossip=GossipConfig(outer=outer, group_size=0))
            sim.run()
        runs[outer] = sim
        hashes = {w.block: set() for w in sim.workers}
        for w in sim.workers:
            hashes[w.block].add(w.state.block_hash)
            assert (w.state.outer is None) == (outer == "none")
        assert all(len(h) == 1 for h in hashes.values())  # replicas bit-identical
    assert runs["none"].workers[0].state.block_hash != runs["nesterov"].workers[0].state.block_hash


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--outer", "adam"], "outer must be 'none' or 'nesterov'"),
        (["--outer", "nesterov", "--outer-momentum", "1"], "--outer-momentum must be in [0, 1)"),
        (["--outer-lr", "0"], "--outer-lr must be > 0"),
    ],
)
def test_outer_flags_reach_the_gossip_config(tmp_path, args, needle):
    from typer.testing import CliRunner

    from cli.main import app

    (tmp_path / "text.txt").write_bytes(b"some text " * 50)
    result = CliRunner().invoke(app, ["run", "--data", str(tmp_path / "text.txt"), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
