"""Two-phase group averaging (swarmd.averaging.phases, GossipConfig.group_layout "two-phase"): the layout, the exact
mean inside one round, a missing member, and the simulator's rounds (swarmd.sim.grouping)."""

from __future__ import annotations

import pytest
import torch
from swarm_utils import tiny_model, tiny_train

from swarmd.averaging import phases
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.groups import assign, round_members
from swarmd.averaging.merge import merge_mean
from swarmd.sim import grouping
from swarmd.sim.engine import SimConfig, Simulator, merge_fn
from swarmd.sim.grouping import BLOCK, EMB
from swarmd.sim.policies import Lockstep
from swarmd.sim.regimes import custom_regime

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(8, 4), (12, 4), (10, 4), (13, 4), (30, 4), (9, 2)]


def _two_phase(layout: list[list[str]], x: dict[str, dict[str, torch.Tensor]], present: set[str]):
    """Phase 1 (plain mean of each row's present payloads) and phase 2 (each peer combines the rows it got from
    present sources): peer -> (its value, the rows it got)."""
    merged = {r: merge_mean({p: x[p] for p in row if p in present}) for r, row in enumerate(layout)}
    counts = {r: sum(p in present for p in row) for r, row in enumerate(layout)}
    out = {}
    for r, row in enumerate(layout):
        for p in row:
            src = phases.sources(layout, p)
            got = sorted(s for s in merged if counts[s] and (s == r or src[s] in present))
            out[p] = phases.combine([(counts[s], merged[s]) for s in got]), set(got)
    return out


@pytest.mark.parametrize("n,k", SHAPES)
def test_rows_are_a_balanced_partition_and_every_peer_reads_every_other_row_once(n, k):
    ids = [f"p{i}" for i in range(n)]
    layout = phases.rows(ids, 3, k, "s")
    assert len(layout) == -(-n // k) and max(map(len, layout)) - min(map(len, layout)) <= 1
    assert max(map(len, layout)) <= k and sorted(p for row in layout for p in row) == sorted(ids)
    assert phases.rows(list(reversed(ids)), 3, k, "s") == layout and phases.rows(ids, 4, k, "s") != layout
    # the group layout hands out the rows (sorted) as phase 1's groups
    assert assign(ids, 3, k, "s", "two-phase") == sorted((sorted(row) for row in layout), key=lambda g: g[0])
    for r, row in enumerate(layout):
        for p in row:
            src = phases.sources(layout, p)
            assert set(src) == set(range(len(layout))) - {r}
            assert all(src[s] in layout[s] for s in src)
            for reader in phases.readers(layout, p):  # readers is the inverse of sources
                assert phases.sources(layout, reader)[r] == p
    assert sum(len(phases.readers(layout, p)) for p in ids) == n * (len(layout) - 1)


@pytest.mark.parametrize("n,k", SHAPES)
def test_two_phases_give_every_peer_the_exact_mean_in_one_round(n, k):
    ids = [f"p{i}" for i in range(n)]
    g = torch.Generator().manual_seed(n)
    x = {p: {"w": torch.randn(64, generator=g), "b": torch.randn(3, 5, generator=g)} for p in ids}
    layout = phases.rows(ids, 0, k, "s")
    got = _two_phase(layout, x, set(ids))
    mean = merge_mean(x)
    first = got[ids[0]][0]
    for value, rows in got.values():
        assert phases.complete(layout, rows)
        assert all(torch.equal(value[name], first[name]) for name in value)  # bit-identical replicas
        assert all(torch.allclose(value[name], mean[name], atol=1e-6) for name in value)  # the global mean


@pytest.mark.parametrize("n,k", [(12, 4), (10, 4)])
def test_a_missing_member_leaves_the_mean_over_what_arrived(n, k):
    """A member that did not arrive: its row merges without it, its readers miss its row (their mean is over the
    rows they got, count-weighted), the others hold the exact mean over the present payloads; nobody fails."""
    ids = [f"p{i}" for i in range(n)]
    g = torch.Generator().manual_seed(7)
    x = {p: {"w": torch.randn(32, generator=g)} for p in ids}
    layout = phases.rows(ids, 1, k, "s")
    missing = layout[0][0]
    present = set(ids) - {missing}
    got = _two_phase(layout, x, present)
    readers = set(phases.readers(layout, missing))
    assert readers  # someone read row 0 from it
    mean = merge_mean({p: x[p] for p in present})
    for p, (value, rows) in got.items():
        assert torch.isfinite(value["w"]).all()
        if p in readers:
            assert not phases.complete(layout, rows) and rows == set(range(1, len(layout)))
            rest = merge_mean({q: x[q] for row in layout[1:] for q in row})
            assert torch.allclose(value["w"], rest["w"], atol=1e-6)
        else:
            assert phases.complete(layout, rows)
            assert torch.allclose(value["w"], mean["w"], atol=1e-6)
    with pytest.raises(ValueError):
        phases.combine([])


def test_round_members_of_the_two_phase_layout_is_the_row():
    ids = [f"p{i}" for i in range(12)]
    cfg = GossipConfig(group_size=4, group_layout="two-phase")
    layout = phases.rows(ids, 5, 4, "s")
    row = next(r for r in layout if "p3" in r)
    assert round_members("p3", ids, 5, cfg, "s") == set(row) - {"p3"}


# -- the simulator -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(text_data):
    from swarmd.core.data import ByteData, load_bytes

    model = tiny_model()
    return (
        ByteData(load_bytes(text_data / "train.txt")[:100_000], model.seq_len),
        ByteData(load_bytes(text_data / "eval.txt")[:20_000], model.seq_len),
    )


def _sim(corpus, layout: str, codec: str = "int8", workers: int = 6, overlap: bool = False) -> Simulator:
    cfg = SimConfig(
        tiny_model(blocks=1),
        tiny_train(),
        workers=workers,
        rounds=3,
        steps_per_round=2,
        codec=codec,
        eval_tokens=256,
        overlap=overlap,
    )
    net = custom_regime(0.1, 0.0, 0.05, 0.0, 100.0, 0.0, dropout=0.0, deadline=None)
    gossip = GossipConfig(group_size=2, table_group_size=2, group_layout=layout, steps_per_round=2)
    return Simulator(cfg, net, Lockstep(), corpus[0], corpus[1].eval_windows(256), gossip=gossip)


def test_the_simulator_s_two_phase_rounds_end_bit_identical_and_re_anchor(corpus):
    """6 replicas in groups of 2 (3 rows) and the table in groups of 2: after every two-phase round every replica
    holds the same bits and no anchor is held, where balanced groups end apart; phase 2's bytes are counted."""
    spreads: dict[str, float] = {}
    sent: dict[str, int] = {}
    for layout in ("balanced", "two-phase"):
        with torch.random.fork_rng(devices=[]):
            sim = _sim(corpus, layout)
            records = [sim.step() for _ in range(2)]
            spreads[layout], sent[layout] = sim.consensus(), sum(r.upload_bytes for r in records)
            if layout == "two-phase":
                assert not any(a.active for w in sim.workers for a in w.anchors.values())
                assert len({w.state.block_hash for w in sim.workers}) == 1
    assert spreads["two-phase"] == 0.0 and spreads["balanced"] > 1e-4
    assert sent["two-phase"] > sent["balanced"]  # phase 2: each row's value to its readers


def test_two_phase_merges_landing_a_round_late_end_bit_identical(corpus):
    """Overlap (merges land a round late): each worker lands its two-phase merge late, and after the drain every
    replica holds the same bits with no anchor held."""
    with torch.random.fork_rng(devices=[]):
        sim = _sim(corpus, "two-phase", overlap=True)
        for _ in range(2):
            sim.step()
        sim.drain()
    assert sim.consensus() == 0.0
    assert not any(a.active for w in sim.workers for a in w.anchors.values())


def test_the_simulator_s_two_phase_round_with_a_missing_member_asks_its_row_mate(corpus):
    """A worker whose payload missed the deadline: its row merges without it and serves no reader; its readers
    take its row's value from the row's next member (phases.fallbacks), so every worker still combines every
    row, ends on the same bits (the mean over what arrived) and the anchor moves."""
    sim = _sim(corpus, "two-phase", codec="fp32")
    sim.groups = grouping.plan(sim.workers, 1, 0, sim.gossip)
    sim.layouts = grouping.plan_phases(sim.workers, 1, 0, sim.gossip)
    rows = sim.layouts[BLOCK][0]
    assert len(rows) == 3
    g = torch.Generator().manual_seed(3)
    outputs = {
        i: tuple({k: torch.randn(v.shape, generator=g) * 1e-2 for k, v in part.items()} for part in w.state.deltas())
        for i, w in enumerate(sim.workers)
    }
    missing = rows[0][0]
    accepted = set(range(len(sim.workers))) - {missing}
    merge = merge_fn(GossipConfig(merge="mean"))
    steps, exact, relayed = grouping.merge_groups(
        sim.workers, sim.groups, accepted, outputs, merge, sim.layouts, grouping.relay_fn("fp32")
    )
    assert relayed[missing] == 0 and relayed[rows[0][1]] > relayed[rows[1][1]]  # its row-mate serves its readers
    assert all(BLOCK in exact[i] for i in range(len(sim.workers)))  # one value everywhere: the anchor moves
    targets = [exact[i][BLOCK] for i in range(len(sim.workers))]
    assert all(torch.equal(t[k], targets[0][k]) for t in targets for k in t)
    mean = merge({sim.workers[i].id: outputs[i][0] for i in accepted})  # the plain mean of what arrived
    anchor = sim.workers[0].anchors[BLOCK].tensors
    assert anchor is not None
    assert all(torch.allclose(targets[0][k], anchor[k] + mean[k], atol=1e-6) for k in mean)
    assert all(steps[i][EMB] is not None for i in range(len(sim.workers)))


def test_fallbacks_ask_the_source_first_then_the_rest_of_its_row():
    ids = [f"p{i}" for i in range(10)]
    layout = phases.rows(ids, 2, 4, "s")
    for p in ids:
        src, asked = phases.sources(layout, p), phases.fallbacks(layout, p)
        assert set(asked) == set(src) and all(asked[s][0] == src[s] for s in src)
        assert all(sorted(asked[s]) == sorted(layout[s]) for s in asked)


def test_the_daemon_takes_the_two_phase_layout_and_the_protocol_simulation_refuses_it():
    from swarmd.node.config import DaemonConfig
    from swarmd.sim.protocol import ProtocolConfig, part_tensors, simulate_part

    assert DaemonConfig(gossip=GossipConfig(group_size=4, group_layout="two-phase")).gossip.group_layout == "two-phase"
    with pytest.raises(ValueError, match="two-phase"):
        simulate_part(part_tensors(tiny_model())["table"], 8, ProtocolConfig(layout="two-phase"), EMB, "t")
