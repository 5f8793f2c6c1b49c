"""The simulator's run loop: real block training, real codec and merge, a simulated network and clock.

Owns SimConfig and Simulator (litepaper section 4.1-4.2); a run's records are swarmd.sim.results', its workers,
their predecessor pulls and chunked steps swarmd.sim.workers'. B blocks, K virtual workers per block (replicas, as
swarm peers hold them). Every worker is a real swarmd.averaging.state.BlockState (a BlockTrainer: AdamW over one
block and its copy of the byte table) with its own data stream and its own ErrorFeedback pair. One round:

1. a RoundDraw samples each worker's compute time (H x a per-step time), one-way latency, upload
   bandwidth and dropout (the only simulated things);
2. the deadline policy names the round's deadline (None = lockstep) from the median ready time
   (swarmd.sim.policies; the adaptive and quantile ones are the daemon's own DeadlinePolicy);
3. every non-dropped worker takes H real local steps (train_steps, the daemon's own call) and encodes
   its block and table deltas with the real codec and error feedback (ErrorFeedback.compress). It
   uploads its block delta to its K-1 replicas and its table delta to the N-1 other workers, so its
   arrival is ready + latency + (those real wire bytes) / bandwidth. A worker whose ready + latency is
   already past the deadline is late whatever it sends: its training and upload are skipped (the
   result would be discarded; skip_late=False trains it anyway, its optimizer state then moves);
4. the round ends at the deadline, or as soon as every non-dropped worker has arrived; an update is
   accepted when it arrived by then. Per block, the accepted block deltas are merged with the
   daemon's merge function (merge_fn(), what Gossip.average applies); the table deltas of every
   accepted worker, all blocks, are merged the same way; no accepted update = that part stays. Every
   worker then starts the next round from the merged weights (BlockState.apply_merge, with the daemon's
   outer optimizer when the GossipConfig given names one: swarmd.averaging.outer);
5. the policy sees what a daemon sees: the arrival times of the accepted updates, how many were missing
   at the close, and the close; the virtual clock advances by the round's length; from-noise CE of the
   merged stack is measured.
With overlap (SimConfig.overlap, the daemon's GossipConfig.overlap), every merge lands late: round r-1's
merge is applied after overlap_steps of round r's H steps (0 = all H: a full round late) with
swarmd.averaging.delayed.land_merge, the daemon's own rule (base moves by the merge, the live weights keep the
steps taken since the snapshot), then the rest of the H steps run and round r's deltas are snapshotted. A
daemon's merge lands after as many steps as its exchange takes, at most H (it snapshots again only once the
merge landed), so overlap_steps=0 bounds the quality cost (overlap_steps models how long the exchange
takes; the clock does not depend on it). The clock counts max(compute, previous round's exchange) per
round (the exchange hides behind the next round's steps), and the last exchange once at the end; CE is
measured on the merged weights (base + the merge in flight), the model a swarm would serve once it lands.
With group averaging (GossipConfig.group_size = k > 0, the daemon's swarmd.averaging.groups), each part's
workers (a block's replicas; every worker for the table) split into the round's grid groups
(swarmd.sim.grouping: groups.assign, the daemon's call, salted per part), each worker keeps its part's
anchor and sends offset + delta through the codec (the daemon's step rule), and each group merges its own
accepted payloads: the members' new bases are anchor + merged offsets, and a round in which a part
averages as one group sets them exactly and drops the anchor (merge.apply_merged's rule). Replicas then
differ between groups: measure() scores replica set 0, and consensus() is the largest relative distance
between same-part bases. Under the "two-phase" layout (swarmd.averaging.phases) the groups' merged offsets are
also averaged across the groups after the close (grouping.merge_groups' phase 2: its bytes join the round's upload
and its slowest transfer the round's seconds), so a round in which every row reached every worker ends them
bit-identical, as a one-group round does.
Nothing depends on how fast this machine is: a run is a function of its configs, regime, policy and
seed (one torch thread for bit-identical reruns). With trajectory training on, each worker trains
with the merged predecessor blocks of the round, refreshed mid-round from the predecessors' working weights
(TrainConfig.predecessor_pulls), as the daemon does. No grpc, no asyncio, no files.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from swarmd.averaging.compact import PULL_INT8_LEVELS, check_pull_codec
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delayed import land_merge
from swarmd.averaging.delta import ErrorFeedback
from swarmd.averaging.groups import offset_int8_levels
from swarmd.averaging.merge import merge_deltas
from swarmd.averaging.outer import outer_for
from swarmd.averaging.state import BlockState
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.evaluate import from_noise_ce
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.core.train import BlockTrainer, seed_for, trajectory_predecessors
from swarmd.protocol import Codec, PayloadKind
from swarmd.sim import grouping
from swarmd.sim.grouping import BLOCK, EMB
from swarmd.sim.moments import average_moments, moments_due
from swarmd.sim.policies import Policy
from swarmd.sim.regimes import Regime, RoundDraw
from swarmd.sim.results import RoundRecord, SimResult
from swarmd.sim.workers import PredecessorHandoff, Worker, train_in_chunks

Tensors = dict[str, torch.Tensor]
Merge = Callable[[dict[str, Tensors]], Tensors]
M = TypeVar("M", bound=torch.nn.Module)


def merge_fn(cfg: GossipConfig | None = None) -> Merge:
    """The merge Gossip.average applies to the accepted deltas (own included): merge.merge_deltas under the
    daemon's GossipConfig (default: the robust rule, norm clip + coordinate-wise trimmed mean)."""
    gossip_cfg = cfg or GossipConfig()
    return lambda deltas: merge_deltas(deltas, gossip_cfg)


def merge_label(cfg: GossipConfig | None = None) -> str:
    """What merge_fn(cfg) does, in words (benchmarks record it)."""
    c = cfg or GossipConfig()
    detail = (
        f", clip {c.clip_factor:g}, trim {c.trim_fraction:g}, min cosine {c.min_cosine:g}, "
        f"distance factor {c.distance_factor:g}"
        if c.merge == "robust"
        else ""
    )
    return f"gossip.merge_deltas ({c.merge}{detail})"


@dataclass(frozen=True)
class SimConfig:
    model: ModelConfig
    train: TrainConfig
    workers: int = 3  # K: virtual workers (replicas) per block
    rounds: int = 10
    steps_per_round: int = 20  # H
    codec: Codec = Codec.INT8
    eval_tokens: int = 4096  # held-out bytes scored for from-noise CE
    eval_every: int = 1  # rounds between CE measurements (the last round is always measured)
    skip_late: bool = True  # skip the training of a worker that cannot make the deadline (see the module doc)
    overlap: bool = False  # merges land one round late, the next round's steps taken meanwhile (see the module doc)
    overlap_steps: int = 0  # with overlap: the next round's steps taken before a merge lands (0 = all H)
    # predecessor pulls (trajectory training): "fp32" exact, or "int8" (swarmd.averaging.compact, at these levels)
    pull_codec: str = "fp32"
    pull_int8_levels: float | None = PULL_INT8_LEVELS
    # AdamW moments averaged across a block's replicas every n rounds (0 = never; swarmd.sim.moments)
    sync_first_moment: int = 0
    sync_second_moment: int = 0
    replica_gain: bool = False  # scale each delta by K replicas' step-size ratio (swarmd.core.optim.replica_gain)

    def __post_init__(self) -> None:
        for name in ("workers", "rounds", "steps_per_round", "eval_tokens", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sync_first_moment < 0 or self.sync_second_moment < 0:
            raise ValueError("sync_first_moment and sync_second_moment must be >= 0 (0 = never)")
        if not 0 <= self.overlap_steps <= self.steps_per_round:
            raise ValueError(f"overlap_steps must be in [0, steps_per_round], got {self.overlap_steps}")
        object.__setattr__(self, "codec", Codec(self.codec))
        check_pull_codec(self.pull_codec)


class Simulator:
    """One simulated swarm: SimConfig's B x K workers on `data`, scored on `eval_xy`, under a regime and policy.

    :param merge: the merge function (default merge_fn(gossip): the daemon's)
    :param gossip: the daemon config whose merge rule (when merge is not given) and outer optimizer
        (outer, outer_lr, outer_momentum: each worker's BlockState gets its own, as each daemon does) apply
    """

    def __init__(
        self,
        cfg: SimConfig,
        regime: Regime,
        policy: Policy,
        data: ByteData,
        eval_xy: tuple[torch.Tensor, torch.Tensor],
        merge: Merge | None = None,
        gossip: GossipConfig | None = None,
    ):
        self.cfg, self.regime, self.policy, self.eval_xy = cfg, regime, policy, eval_xy
        self.merge = merge or merge_fn(gossip)
        m, t = cfg.model, cfg.train
        g = self.gossip = gossip or GossipConfig()
        self.workers = [
            Worker(
                f"b{b}w{k}",
                b,
                BlockState(BlockTrainer(m, t, b, "cpu", worker_seed=k), outer_for(g)),
                data.stream(seed_for("data", t.seed, b, k), t.batch_size),
                {PayloadKind.BLOCK_DELTA: ErrorFeedback(), PayloadKind.EMBEDDING_DELTA: ErrorFeedback()},
            )
            for b in range(m.blocks)
            for k in range(cfg.workers)
        ]
        self.rng = np.random.default_rng(seed_for("sim-network", t.seed))
        self.clock = 0.0
        self.round = 0
        # overlap: the merge in flight (per worker: grouping.merge_groups' steps and exact landings) and its
        # exchange seconds
        self.pending: tuple[list[dict[PayloadKind, Tensors | None]], list[dict[PayloadKind, Tensors]]] | None = None
        self.pending_comm_s = 0.0
        self.groups: grouping.Groups = {}  # this round's (groups, grouped) per part (swarmd.sim.grouping)
        self.layouts: grouping.Layouts = {}  # ... and, two-phase layout, each grouped part's rows
        self.handoff = PredecessorHandoff(cfg.pull_codec, cfg.pull_int8_levels)  # predecessor pulls and their bytes

    # -- measuring ------------------------------------------------------------------------------------
    def heads(self) -> list[Worker]:
        """Worker 0 of every block: after a merge all replicas of a block hold the same weights."""
        return self.workers[:: self.cfg.workers]  # built block-major: worker k of block b is b * workers + k

    def measure(self) -> float:
        heads = self.heads()
        x, y = self.eval_xy
        blocks, emb = [w.state.trainer.block for w in heads], heads[0].state.trainer.emb
        if self.cfg.overlap:
            blocks, emb = self._merged_view(heads)
        return float(from_noise_ce(blocks, emb, x, y, self.cfg.model)["ce"])

    def consensus(self) -> float:
        """grouping.consensus of the workers (0 while every part is bit-identical across its replicas)."""
        return grouping.consensus(self.workers, self.cfg.model.blocks)

    def _merged_view(self, heads: list[Worker]) -> tuple[list[DenoisingBlock], ByteEmbedding]:
        """Copies of the heads' blocks and table holding base + the merge in flight (overlap: the merged model)."""
        steps = self.pending[0] if self.pending is not None else [{} for _ in self.workers]

        def view(module: M, base: Tensors, delta: Tensors | None) -> M:
            out = copy.deepcopy(module)
            out.load_state_dict({k: base[k] + delta[k] if delta is not None else base[k] for k in base})
            return out

        own = [steps[self.workers.index(w)] for w in heads]
        blocks = [view(w.state.trainer.block, w.state.base_block, s.get(BLOCK)) for w, s in zip(heads, own)]
        return blocks, view(heads[0].state.trainer.emb, heads[0].state.base_emb, own[0].get(EMB))

    def _land(self, w: Worker) -> None:
        """Overlap: the merge in flight lands on w (late, with the correction for w's own delta in it)."""
        if self.pending is not None and w.exact is not None:
            i = self.workers.index(w)
            steps, exact = self.pending[0][i], self.pending[1][i]
            land_merge(w.state, steps.get(BLOCK), steps.get(EMB), *w.exact)
            self._land_exact(w, exact)

    @staticmethod
    def _land_exact(w: Worker, exact: dict[PayloadKind, Tensors]) -> None:
        """A part averaged as one group lands its exact bits and drops the anchor (merge.apply_merged's rule)."""
        if exact:
            w.state.rebase(exact.get(BLOCK), exact.get(EMB))
            for kind in exact:
                w.anchors[kind].clear()

    # -- one round ------------------------------------------------------------------------------------
    def _use_predecessors(self, w: Worker) -> None:
        """Trajectory training (trajectory_prob > 0): the round's merged predecessor blocks, as the daemon pulls."""
        if self.cfg.train.trajectory_prob <= 0:
            return
        needed = {b for b, _ in trajectory_predecessors(self.cfg.model, w.block)} - {w.block}
        if needed:
            heads = {h.block: h for h in self.heads()}
            w.state.use_predecessors(self._handoff(w, {b: heads[b].state.base_block for b in needed}))

    def _handoff(
        self, w: Worker, states: dict[int, Tensors], held: dict[int, Tensors] | None = None
    ) -> dict[int, Tensors]:
        """Predecessor states as worker w pulls them (PredecessorHandoff.pull), their bytes counted in pulled."""
        return self.handoff.pull(w.id, states, self.round, held)

    @property
    def pulled(self) -> dict[str, tuple[int, int]]:
        """This round's predecessor pulls per worker id: (wire, raw fp32) bytes."""
        return self.handoff.pulled

    def _train(self, trained: list[Worker]) -> dict[str, float]:
        """The round's H real steps of these workers (id -> train CE): with overlap, the merge in flight lands
        partway; else in chunks with the daemon's mid-round predecessor pulls between them (train_in_chunks)."""
        self.handoff.new_round()
        for w in trained:
            self._use_predecessors(w)
        H = self.cfg.steps_per_round
        if self.cfg.overlap:  # the merge in flight lands after overlap_steps of the H steps (round-start pulls only)
            k = self.cfg.overlap_steps or H
            ces: dict[str, float] = {}
            for w in trained:
                before = w.state.train_steps(k, w.batches)
                self._land(w)
                after = w.state.train_steps(H - k, w.batches) if k < H else {"ce": 0.0}
                ces[w.id] = (k * before["ce"] + (H - k) * after["ce"]) / H
                w.exact = w.state.deltas()
            return ces
        return train_in_chunks(trained, {w.id: self.steps_of(w) for w in trained}, self.cfg.train, self._handoff)

    def steps_of(self, w: Worker) -> int:
        """The steps `w` takes a round: H (a subclass may give each block its own)."""
        return self.cfg.steps_per_round

    def _encode(self, w: Worker) -> tuple[int, Tensors, Tensors]:
        """Both deltas of a worker that trained, through the real codec: (upload bytes, decoded block, emb)."""
        block_delta, emb_delta = w.exact if self.cfg.overlap and w.exact is not None else w.state.deltas()
        header = dict(swarm_id="sim", config_hash=self.cfg.model.config_hash(), round=self.round, peer_id=w.id)
        decoded, sent = {}, 0
        for kind, delta, base, base_hash in (
            (PayloadKind.BLOCK_DELTA, block_delta, w.state.base_block, w.state.block_hash),
            (PayloadKind.EMBEDDING_DELTA, emb_delta, w.state.base_emb, w.state.emb_hash),
        ):
            part = "block" if kind.is_block else "emb"
            if self.cfg.replica_gain:
                delta = w.state.replica_gain(part, delta, self.cfg.workers)
            delta = w.state.local_outer_step(part, delta)  # (group averaging)
            anchor = w.anchors[kind]
            offset = anchor.offset(base)  # group averaging: base - anchor + delta (the delta without an anchor)
            enc, decoded[kind] = w.ef[kind].compress(
                delta if offset is None else {k: offset[k] + delta[k] for k in delta},
                self.cfg.codec,
                kind=kind,
                block_index=w.block if kind.is_block else -1,
                base_hash=anchor.hash if anchor.active else base_hash,
                weight=float(self.steps_of(w)),
                int8_rms_levels=offset_int8_levels(anchor),
                **header,
            )
            sent += enc.wire_bytes * (
                len(grouping.group_of(self.groups, kind, self.workers.index(w))) - 1
            )  # to the other members of its group
        return sent, decoded[PayloadKind.BLOCK_DELTA], decoded[PayloadKind.EMBEDDING_DELTA]

    def _draw(self, n: int, steps: int) -> RoundDraw:
        """This round's sampled clock and network for the n workers (a subclass may reprice a worker's compute)."""
        return RoundDraw.sample(self.regime, self.rng, n, steps)

    def step(self) -> RoundRecord:
        """Run one round (see the module doc) and return its record (CE not yet measured)."""
        n, H = len(self.workers), self.cfg.steps_per_round
        draw = self._draw(n, H)
        live = [i for i in range(n) if not draw.dropped[i]]
        ready = statistics.median(draw.compute_s[i] for i in live) if live else float(np.median(draw.compute_s))
        deadline = self.policy.deadline(float(ready), n)
        arrivals: dict[int, float] = {}
        outputs: dict[int, tuple[Tensors, Tensors]] = {}
        sent, trained = 0, []
        for i in live:
            w = self.workers[i]
            if deadline is not None and self.cfg.skip_late and draw.compute_s[i] + draw.latency_s[i] > deadline:
                arrivals[i] = draw.arrival_s(i, w.upload_bytes)  # late whatever it sends
                continue
            trained.append(i)
        ces = self._train([self.workers[i] for i in trained])
        if self.cfg.overlap:
            for i in set(range(n)) - set(trained):  # the workers that did not train land the merge in flight too
                self._land(self.workers[i])
                self.workers[i].exact = self.workers[i].state.deltas()
        # the round's groups, once the last merge landed (a daemon plans when its round's exchange starts)
        self.groups = grouping.plan(self.workers, self.cfg.model.blocks, self.round, self.gossip)
        self.layouts = grouping.plan_phases(self.workers, self.cfg.model.blocks, self.round, self.gossip)
        for i in trained:
            w = self.workers[i]
            w.upload_bytes, block_d, emb_d = self._encode(w)
            sent += w.upload_bytes
            outputs[i] = (block_d, emb_d)
            arrivals[i] = draw.arrival_s(i, w.upload_bytes)
        last = max(arrivals.values(), default=None)
        if deadline is None:
            end = last if last is not None else float(draw.compute_s.max())
        else:
            end = deadline if last is None else min(deadline, last)
        accepted = sorted(i for i in outputs if arrivals[i] <= end)
        seconds = end
        if self.cfg.overlap:
            seconds = max(float(ready), self.pending_comm_s)  # this round's steps hid the last round's exchange
            self.pending_comm_s = max(0.0, end - float(ready))
        relayed = self._merge(accepted, outputs)
        if any(relayed):  # two-phase: the rows' values cross after the close (one more exchange)
            sent += sum(relayed)
            phase2_s = max(float(draw.latency_s[i] + b / draw.bandwidth_Bps[i]) for i, b in enumerate(relayed) if b)
            if self.cfg.overlap:
                self.pending_comm_s += phase2_s
            else:
                seconds += phase2_s
        self.policy.observe([arrivals[i] for i in accepted], n - len(accepted), end, float(ready))
        self.round += 1
        self.clock += seconds
        return RoundRecord(
            self.round,
            self.clock,
            seconds,
            deadline,
            n,
            n - len(live),
            len(live) - len(accepted),
            len(accepted),
            sent,
            float(np.mean(list(ces.values()))) if ces else float("nan"),
            None,
        )

    def _merge(self, accepted: list[int], outputs: dict[int, tuple[Tensors, Tensors]]) -> list[int]:
        """Each group of each part merges its accepted payloads (all-to-all: per block, its replicas' block
        deltas; the table, every accepted worker's); an anchored member lands anchor + merged offsets (two-phase:
        the rows' combined ones). Returns each worker's phase-2 wire bytes (0 without the two-phase layout)."""
        relay = grouping.relay_fn(self.cfg.codec) if self.layouts else None
        steps, exact, relayed = grouping.merge_groups(
            self.workers, self.groups, set(accepted), outputs, self.merge, self.layouts, relay
        )
        due = moments_due(self.round + 1, self.cfg.sync_first_moment, self.cfg.sync_second_moment)
        for b in range(self.cfg.model.blocks) if due else ():  # a block's accepted replicas (swarmd.sim.moments)
            average_moments([self.workers[i].state.trainer.opt for i in accepted if self.workers[i].block == b], due)
        if self.cfg.overlap:  # lands during the next round's steps (_land)
            self.pending = (steps, exact)
            return relayed
        for i, w in enumerate(self.workers):
            w.state.apply_merge(steps[i].get(BLOCK), steps[i].get(EMB))
            self._land_exact(w, exact[i])
        return relayed

    def drain(self) -> float:
        """Overlap: land the merge in flight on every worker; returns the seconds its exchange adds to the clock."""
        if self.pending is None:
            return 0.0
        for w in self.workers:
            self._land(w)
            w.exact = w.state.deltas()
        self.pending, extra, self.pending_comm_s = None, self.pending_comm_s, 0.0
        self.clock += extra
        return extra

    # -- the run --------------------------------------------------------------------------------------
    def run(self, on_round: Callable[[RoundRecord], None] | None = None, until_s: float | None = None) -> SimResult:
        """cfg.rounds rounds, or fewer: with until_s, stop after the round that reaches that simulated time."""
        result = SimResult(self.regime.name, self.policy.name, self.cfg.train.seed, self.measure())
        for r in range(1, self.cfg.rounds + 1):
            record = self.step()
            last = r == self.cfg.rounds or (until_s is not None and self.clock >= until_s)
            if last and self.cfg.overlap:  # the last merge lands: every worker ends on the merged weights
                record.seconds += self.drain()
                record.t_s = self.clock
            if r % self.cfg.eval_every == 0 or last:
                record.ce, record.consensus = self.measure(), self.consensus()
            result.rounds.append(record)
            if on_round is not None:
                on_round(record)
            if last:
                break
        return result


def simulate(
    cfg: SimConfig,
    regime: Regime,
    policy: Policy,
    data: ByteData,
    eval_data: ByteData,
    on_round: Callable[[RoundRecord], None] | None = None,
    until_s: float | None = None,
    merge: Merge | None = None,
    gossip: GossipConfig | None = None,
) -> SimResult:
    """Build a Simulator (eval windows: eval_tokens bytes of eval_data) and run it (see Simulator.run)."""
    sim = Simulator(cfg, regime, policy, data, eval_data.eval_windows(cfg.eval_tokens), merge, gossip)
    return sim.run(on_round, until_s)
