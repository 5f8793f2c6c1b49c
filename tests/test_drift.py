"""DriftTracker (swarmd.averaging.drift): a peer adding a fixed direction each round is flagged within a stated number
of rounds at 1.0x the honest norm, honest noise (independent or AR(1)-correlated, isotropic or not) is never
flagged over 500 rounds, verdicts are deterministic, memory is bounded, and real deltas of the simulator agree."""

from __future__ import annotations

import math

import pytest
import torch

from swarmd.averaging.drift import DriftTracker, threshold
from swarmd.averaging.robust import robust_merge
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData, load_bytes
from swarmd.sim.engine import SimConfig, Simulator, merge_fn
from swarmd.sim.policies import Lockstep
from swarmd.sim.regimes import regime_named

DIM = 4096


def synthetic_run(
    peers: int, factor: float, rounds: int, seed: int, rho: float = 0.4, anisotropic: bool = False
) -> tuple[int | None, set[str], DriftTracker]:
    """Honest deltas = a common step + AR(1) noise (1.5x its norm); the last peer adds factor x its own norm along a
    fixed direction. Flagged peers are left out of the next merges, as the caller does. Returns (the round the
    attacker was flagged, 1-based; the honest peers flagged; the tracker)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.arange(1, DIM + 1, dtype=torch.float32) ** -0.5 if anisotropic else torch.ones(DIM)
    scale = scale / scale.norm()
    v = torch.randn(DIM, generator=gen)
    v /= v.norm()
    tracker = DriftTracker(part="synthetic")
    state = [torch.zeros(DIM) for _ in range(peers)]
    attacker, caught, honest = f"peer{peers - 1}", None, set()
    for t in range(rounds):
        common = torch.randn(DIM, generator=gen) / math.sqrt(DIM)
        deltas = {}
        for i in range(peers):
            state[i] = rho * state[i] + math.sqrt(1 - rho * rho) * 1.5 * scale * torch.randn(DIM, generator=gen)
            d = common + state[i]
            if factor and i == peers - 1:
                d = d + factor * float(d.norm()) * v
            deltas[f"peer{i}"] = {"w": d}
        live = {p: x for p, x in deltas.items() if p not in tracker.excluded()}
        for p in tracker.observe(t, live, robust_merge(live)[0]):
            if p == attacker and factor:
                caught = t + 1
            else:
                honest.add(p)
    return caught, honest, tracker


@pytest.mark.parametrize(("peers", "within"), [(3, 30), (4, 22)])
@pytest.mark.parametrize("factor", [1.0, 1.7])
def test_a_fixed_direction_is_flagged_within_n_rounds(peers, within, factor):
    for seed in range(3):
        for anisotropic in (False, True):
            caught, honest, tracker = synthetic_run(peers, factor, 40, seed, anisotropic=anisotropic)
            assert caught is not None and caught <= within, (seed, anisotropic, caught)
            assert not honest, (seed, anisotropic, honest)
            assert tracker.excluded() == {f"peer{peers - 1}"}


@pytest.mark.parametrize("peers", [3, 4])
def test_honest_noise_is_never_flagged_over_500_rounds(peers):
    for seed, anisotropic, rho in ((0, False, 0.0), (1, False, 0.4), (2, True, 0.4)):
        _, honest, tracker = synthetic_run(peers, 0.0, 500, seed, rho=rho, anisotropic=anisotropic)
        assert not honest and not tracker.excluded(), (seed, anisotropic, rho)


def test_the_threshold_sums_to_the_false_positive_rate():
    alpha = 1e-4
    # the per-round chance behind threshold(n): e^-x with x = ln(pi^2 n^2 / (6 alpha)); their sum over n is alpha
    x = [math.log(math.pi**2 * n * n / (6 * alpha)) for n in range(1, 200_001)]
    assert sum(math.exp(-xi) for xi in x) == pytest.approx(alpha, rel=1e-4)
    assert threshold(10, alpha) == pytest.approx(math.sqrt(2 * x[9]) + math.sqrt(2) * x[9])
    assert threshold(20, alpha) > threshold(10, alpha) > threshold(10, 1e-2)


def test_verdicts_are_deterministic():
    a = synthetic_run(3, 1.0, 30, seed=5)
    b = synthetic_run(3, 1.0, 30, seed=5)
    assert a[0] == b[0] and a[1] == b[1]
    for peer_id in ("peer0", "peer1", "peer2"):
        assert a[2].score(peer_id) == b[2].score(peer_id)


def test_two_peers_and_own_peer_are_never_flagged():
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(256, dtype=torch.float64, generator=gen)
    pair, own = DriftTracker(), DriftTracker(me="peer2")
    for t in range(60):
        noise = [torch.randn(256, dtype=torch.float64, generator=gen) for _ in range(3)]
        assert not pair.observe_vectors(t, {"peer0": noise[0] + 3 * v, "peer1": -noise[0] - 3 * v})
        assert not own.observe_vectors(t, {"peer0": noise[0], "peer1": noise[1], "peer2": noise[2] + 3 * v})
    assert pair.score("peer0").z > pair.score("peer0").threshold  # it does drift; with two peers, so does the other
    assert own.score("peer2").z > own.score("peer2").threshold


def test_memory_is_bounded_by_peers_and_flags():
    tracker = DriftTracker(max_peers=16, max_flagged=4, min_rounds=6)
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(64, dtype=torch.float64, generator=gen)
    for t in range(200):  # 3 honest peers, plus a new identity every round, and a drifting one every 20 rounds
        devs = {f"h{i}": torch.randn(64, dtype=torch.float64, generator=gen) for i in range(3)}
        devs[f"sybil{t}"] = torch.randn(64, dtype=torch.float64, generator=gen)
        devs[f"drift{t // 20}"] = torch.randn(64, dtype=torch.float64, generator=gen) + 4 * v
        tracker.observe_vectors(t, devs)
        assert tracker.tracked() <= 16
        assert len(tracker.excluded()) <= 4
    assert tracker.excluded() and all(p.startswith("drift") for p in tracker.excluded())
    crowd = {f"c{i:02d}": torch.randn(64, dtype=torch.float64, generator=gen) for i in range(40)}
    tracker.observe_vectors(200, crowd)  # more peers in one round than it keeps
    assert tracker.tracked() == 16


def test_observe_reduces_deltas_to_sketches_and_finds_the_centre():
    gen = torch.Generator().manual_seed(2)
    v = {"a": torch.randn(40, 30, generator=gen), "b": torch.randn(500, generator=gen)}
    tracker = DriftTracker(sketch_size=64, min_rounds=8)
    exact = DriftTracker(sketch_size=0, min_rounds=8)
    for t in range(40):
        deltas = {f"p{i}": {k: torch.randn(x.shape, generator=gen) for k, x in v.items()} for i in range(4)}
        deltas["p3"] = {k: deltas["p3"][k] + 2 * v[k] / math.sqrt(1700) * 40 for k in v}
        tracker.observe(t, deltas)  # centre=None: the robust merge of the deltas given
        exact.observe(t, deltas)
    assert tracker.reduce(v).shape == (64,) and exact.reduce(v).shape == (1700,)
    assert tracker.excluded() == {"p3"} and exact.excluded() == {"p3"}


# -- real deltas: the simulator's tiny model, its real training, codec and merge -------------------------------------
TINY = ModelConfig(blocks=1, layers_per_block=1, d_model=32, n_heads=2, hidden=64, seq_len=16)


@pytest.fixture(scope="module")
def corpus(text_data):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    train = ByteData(load_bytes(text_data / "train.txt")[:300_000], TINY.seq_len)
    held_out = ByteData(load_bytes(text_data / "eval.txt")[:20_000], TINY.seq_len)
    yield train, next(held_out.stream(1, 16))
    torch.set_num_threads(threads)


def sim_run(corpus, factor: float, rounds: int) -> tuple[int | None, set[str]]:
    """3 replicas of one block; worker 2 adds factor x its block delta's norm along a fixed direction before the merge;
    the block merge leaves out the peers the tracker flagged. (round the attacker was flagged, honest flagged)."""
    train, held_out = corpus
    train_cfg = TrainConfig(batch_size=4, warmup_steps=5)
    cfg = SimConfig(TINY, train_cfg, workers=3, rounds=rounds, steps_per_round=10, eval_tokens=256, eval_every=rounds)
    merge, tracker = merge_fn(), DriftTracker(part="block 0")
    direction: dict[str, torch.Tensor] = {}
    caught, honest, round_ = None, set(), [0]

    def checked_merge(deltas):
        if "table" in next(iter(deltas.values())):
            return merge(deltas)  # the byte table: not tracked here
        if factor and "b0w2" in deltas:
            x = deltas["b0w2"]
            if not direction:
                gen = torch.Generator().manual_seed(7)
                direction.update({k: torch.randn(t.shape, generator=gen) for k, t in x.items()})
                norm = math.sqrt(sum(float(t.pow(2).sum()) for t in direction.values()))
                direction.update({k: t / norm for k, t in direction.items()})
            norm = math.sqrt(sum(float(t.pow(2).sum()) for t in x.values()))
            deltas = {**deltas, "b0w2": {k: x[k] + factor * norm * direction[k] for k in x}}
        live = {p: d for p, d in deltas.items() if p not in tracker.excluded()}
        merged = merge(live)
        nonlocal caught
        for p in tracker.observe(round_[0], live, merged):
            if p == "b0w2" and factor:
                caught = round_[0] + 1
            else:
                honest.add(p)
        round_[0] += 1
        return merged

    Simulator(cfg, regime_named("lockstep"), Lockstep(), train, held_out, merge=checked_merge).run()
    return caught, honest


def test_real_deltas_a_drifting_replica_is_flagged_and_honest_ones_are_not(corpus):
    caught, honest = sim_run(corpus, 1.0, 30)
    assert caught is not None and caught <= 20, caught
    assert not honest
    caught, honest = sim_run(corpus, 0.0, 80)
    assert caught is None and not honest
