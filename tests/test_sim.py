"""The network simulator (swarmd.sim): a tiny regime runs, seeds reproduce, the lockstep and 0% extremes, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData, load_bytes
from swarmd.errors import ConfigError
from swarmd.sim.engine import SimConfig, Simulator, simulate
from swarmd.sim.policies import Daemon, Fixed, Lockstep, make_policy, quantile
from swarmd.sim.regimes import PRESETS, Dist, RoundDraw, custom_regime, regime_named

TINY_MODEL = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=64, seq_len=16)
TINY = SimConfig(
    TINY_MODEL, TrainConfig(batch_size=4, warmup_steps=2), workers=2, rounds=2, steps_per_round=2, eval_tokens=256
)
TINY_FLAGS = [
    "--blocks",
    "2",
    "--d-model",
    "16",
    "--n-heads",
    "2",
    "--seq-len",
    "16",
    "--batch-size",
    "4",
    "--workers",
    "2",
    "--rounds",
    "2",
    "--steps-per-round",
    "2",
    "--eval-tokens",
    "256",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread, as the CLI and the benchmark run the simulator (tiny models are slower on more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(text_data):
    train = ByteData(load_bytes(text_data / "train.txt")[:100_000], TINY_MODEL.seq_len)
    held_out = ByteData(load_bytes(text_data / "eval.txt")[:20_000], TINY_MODEL.seq_len)
    return train, held_out


def _run(corpus, regime, policy=None, cfg=TINY):
    with torch.random.fork_rng(devices=[]):
        return simulate(cfg, regime, policy or Lockstep(), *corpus)


def test_a_tiny_regime_runs(corpus):
    wan = regime_named("WAN mid")
    result = _run(corpus, wan, make_policy("fixed", wan, TINY.steps_per_round))
    assert result.regime == "wan-mid" and result.policy == "fixed" and len(result.rounds) == 2
    assert math.isfinite(result.ce) and 0 <= result.participation <= 1
    assert result.sim_wall_s > 0 and result.rounds[-1].t_s == pytest.approx(sum(r.seconds for r in result.rounds))
    for r in result.rounds:
        assert r.seconds <= wan.deadline_s(TINY.steps_per_round) + 1e-9  # a fixed deadline bounds every round
        assert r.dropped + r.late + r.accepted == r.workers == 4
    summary = result.to_dict()
    assert {"ce", "participation", "sim_wall_s", "wire_bytes", "history"} <= set(summary)


def test_same_seed_same_result_other_seed_differs(corpus):
    wan = regime_named("wan-loose")
    a = _run(corpus, wan, make_policy("quantile", wan, TINY.steps_per_round)).to_dict()
    b = _run(corpus, wan, make_policy("quantile", wan, TINY.steps_per_round)).to_dict()
    assert a == b  # bit for bit: the CE, the simulated clock, the bytes
    other = replace(TINY, train=replace(TINY.train, seed=1))
    c = _run(corpus, wan, make_policy("quantile", wan, TINY.steps_per_round), other).to_dict()
    assert c["ce"] != a["ce"] and c["sim_wall_s"] != a["sim_wall_s"]


def test_lockstep_accepts_every_worker_that_did_not_drop(corpus):
    flaky = custom_regime(0.1, 0.5, 0.05, 0.5, 50.0, 1.0, dropout=0.3, deadline=None)
    result = _run(corpus, flaky, Lockstep(), replace(TINY, rounds=3))
    assert sum(r.dropped for r in result.rounds) > 0  # the seed drops someone, so the check below means something
    for r in result.rounds:
        assert r.late == 0 and r.accepted == r.workers - r.dropped


def test_zero_participation_leaves_the_model_unchanged(corpus):
    never = custom_regime(0.1, 0.0, 0.01, 0.0, 1000.0, 0.0, dropout=0.0, deadline=0.5)  # deadline < compute
    sim = Simulator(
        TINY,
        never,
        make_policy("fixed", never, TINY.steps_per_round),
        corpus[0],
        corpus[1].eval_windows(TINY.eval_tokens),
    )
    before = [{k: v.clone() for k, v in w.state.trainer.block.state_dict().items()} for w in sim.heads()]
    table = sim.heads()[0].state.trainer.emb.table.detach().clone()
    result = sim.run()
    assert result.participation == 0 and result.wire_bytes == 0
    assert result.ce == result.ce_start  # no learning at all
    for w, sd in zip(sim.heads(), before):
        assert all(torch.equal(v, sd[k]) for k, v in w.state.trainer.block.state_dict().items())
    assert torch.equal(sim.heads()[0].state.trainer.emb.table, table)


def test_policies_and_regimes():
    assert set(PRESETS) == {
        "lockstep",
        "async-mild",
        "wan-tight",
        "wan-mid",
        "wan-loose",
        "edge-mid",
        "bad-edge",
        "bad-edge-loose",
    }
    with pytest.raises(ConfigError, match="unknown regime"):
        regime_named("wan-nope")
    with pytest.raises(ConfigError, match="no fixed deadline"):
        make_policy("fixed", PRESETS["lockstep"], 20)
    draw = RoundDraw.sample(PRESETS["wan-mid"], np.random.default_rng(0), 5, 20)
    assert draw.arrival_s(0, 1e5) == pytest.approx(draw.compute_s[0] + draw.latency_s[0] + 1e5 / draw.bandwidth_Bps[0])
    assert Dist(2.0).sample(np.random.default_rng(0), 3).tolist() == [2.0, 2.0, 2.0]
    q = make_policy("quantile", PRESETS["wan-mid"], 20, target=0.5)
    assert isinstance(q, Daemon) and q.policy.target == 0.5
    max_s = q.policy.cfg.deadline_max_s
    assert q.deadline(1.0, 9) == pytest.approx(1.0 + max_s)  # nothing seen yet: the daemon's upper bound
    q.observe([3.0, 4.0, 5.0, 6.0], 0, 6.0, 1.0)
    assert q.deadline(1.0, 9) == pytest.approx(4.0)  # the 2nd of 4 arrivals
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(float(np.quantile([1, 2, 3, 4], 0.25)))
    assert Fixed(3.0).deadline(1.0, 9) == 3.0
    adaptive = make_policy("adaptive", PRESETS["wan-mid"], 20)
    assert isinstance(adaptive, Daemon) and adaptive.policy.target == 0
    assert adaptive.deadline(2.0, 9) == pytest.approx(2.0 + max_s)  # nothing measured yet


runner = CliRunner()


def test_cli_simulate_json_and_a_bad_regime(text_data):
    result = runner.invoke(app, ["simulate", "--regime", "async-mild", "--data", str(text_data), *TINY_FLAGS, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["regime"] == "async-mild" and out["policy"] == "fixed" and out["rounds"] == 2
    assert math.isfinite(out["ce"]) and out["wire_bytes"] > 0
    bad = runner.invoke(app, ["simulate", "--regime", "wan-nope"])
    assert bad.exit_code == 2
    assert bad.output.strip().count("\n") == 0 and "unknown regime" in bad.output
    custom = runner.invoke(app, ["simulate", "--regime", "lockstep", "--dropout", "0.5"])
    assert custom.exit_code == 2 and "--regime custom" in custom.output


@pytest.mark.parametrize("pulls", [1, 2])
def test_workers_refresh_their_predecessors_mid_round_as_daemons_do(corpus, pulls):
    cfg = replace(
        TINY, rounds=1, steps_per_round=4, train=replace(TINY.train, trajectory_prob=1.0, predecessor_pulls=pulls)
    )
    lockstep = regime_named("lockstep")
    sim = Simulator(cfg, lockstep, Lockstep(), corpus[0], corpus[1].eval_windows(cfg.eval_tokens))
    merged = {k: v.clone() for k, v in sim.heads()[0].state.base_block.items()}  # block 0 at round start
    sim.step()
    late = sim.workers[-1]  # a block-1 replica
    ran = late.state.trainer.others[0].state_dict()
    # one pull: the round-start merged block 0; two: block 0's first replica after the round's first 2 steps
    assert all(torch.equal(ran[k], merged[k]) for k in merged) == (pulls == 1)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_prefetched_pull_runs_block_0_as_it_was_halfway_through_the_chunk_before(corpus, prefetch):
    """TrainConfig.prefetch_pulls in the simulator, as in the daemon: with 4 steps in 2 chunks the pull for the
    second chunk is block 0's replica after its first step (halfway through chunk 1), else after its second."""
    train = replace(TINY.train, trajectory_prob=1.0, predecessor_pulls=2, prefetch_pulls=prefetch)
    cfg = replace(TINY, rounds=1, steps_per_round=4, train=train)
    sim = Simulator(cfg, regime_named("lockstep"), Lockstep(), corpus[0], corpus[1].eval_windows(cfg.eval_tokens))
    source, seen = sim.heads()[0], []
    steps = source.state.train_steps

    def recorded(n, batches, stop=None):
        out = steps(n, batches, stop)
        seen.append((source.state.trainer.step_count, source.state.current()[0]))
        return out

    source.state.train_steps = recorded
    sim.step()
    ran = sim.workers[-1].state.trainer.others[0].state_dict()  # what a block-1 replica ran last
    after = dict(seen)[1 if prefetch else 2]
    assert all(torch.allclose(ran[k], after[k], atol=1e-6) for k in after)
    assert [n for n, _ in seen] == ([1, 2, 4] if prefetch else [2, 4])


def test_group_averaging_merges_each_group_apart_and_a_full_round_reunites_them(corpus):
    """Groups of 2 among 4 replicas per block (and 8 workers for the table): members of a round's group end
    bit-identical, groups differ (consensus > 0) until a one-group round, which sets every replica to the same
    bits and drops the anchors, as the daemon's apply_merged does; all-to-all keeps consensus at 0."""
    from swarmd.averaging.config import GossipConfig
    from swarmd.averaging.sketch import flatten
    from swarmd.protocol import PayloadKind

    cfg = replace(TINY, workers=4, rounds=3)
    gossip = GossipConfig(steps_per_round=cfg.steps_per_round, group_size=2, group_full_every=3)
    with torch.random.fork_rng(devices=[]):
        sim = Simulator(
            cfg, regime_named("lockstep"), Lockstep(), corpus[0], corpus[1].eval_windows(256), gossip=gossip
        )
        sim.step()  # round 0: 0 % 3 == 0, one group of everybody
        assert sim.consensus() == 0.0
        sim.step()  # round 1: groups of 2
        groups, grouped = sim.groups[PayloadKind.BLOCK_DELTA]
        assert grouped and all(len(g) == 2 for g in groups) and len(groups) == 4  # 2 blocks x 2 groups
        for g in groups:
            a, b = (sim.workers[i].state.base_block for i in g)
            assert torch.equal(flatten(a), flatten(b))
        assert sim.consensus() > 0 and all(w.anchors[PayloadKind.BLOCK_DELTA].active for w in sim.workers)
        sim.step()  # round 2: groups again
        assert sim.consensus() > 0
        sim.cfg = replace(cfg, rounds=4)
        sim.step()  # round 3: 3 % 3 == 0, one group: same bits everywhere, anchors dropped
        assert sim.consensus() == 0.0
        assert not any(a.active for w in sim.workers for a in w.anchors.values())
    with torch.random.fork_rng(devices=[]):
        plain = Simulator(cfg, regime_named("lockstep"), Lockstep(), corpus[0], corpus[1].eval_windows(256))
        result = plain.run()
    assert [r.consensus for r in result.rounds] == [0.0, 0.0, 0.0]
