"""A simulated swarm of P peers under a schedule, on the cost model's clock: time to quality, peer by peer.

Owns SchedulePlan (a schedule of swarmd.core.schedule with its turn rounds, the peers and whether they are pinned
to a block) and ScheduledSimulator, the engine's Simulator with three things added:
  - staffing: every round the schedule says which blocks train and how many peers each gets (allocate); a block's
    first worker is its keeper, which holds the block's merged state while no peer trains it; a peer that comes
    to a block adopts the block's merged state and the swarm's merged table, and pays the download on its clock;
  - growth: a block's first round warm-starts it from its predecessor's merged state (TrainConfig.block_init
    "predecessor", BlockState.warm_start, as a daemon does);
  - balanced steps (SchedulePlan.balance_steps): a block whose step is cheaper takes more steps a round, as many as
    fill the slowest block's round (StepCosts.balanced_steps), its learning-rate schedule over its own steps;
  - the clock: a worker's compute is its steps x its block's measured step cost (StepCosts.block_s) times the regime's
    jitter, stretched to the time its predecessor pulls take on its link, plus a daemon's fixed costs of a round
    (StepCosts.round_s, and pull_s per predecessor pull); the rest (latency, upload of the real
    codec's bytes, deadline, merge) is the engine's.
Each RoundRecord is followed by a ScheduleRecord: the staffing, the peer-seconds spent training (busy_share) and
the bytes pulled. Training, codec and merge are the real ones; only the clock and the network are simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delta import ErrorFeedback
from swarmd.averaging.outer import outer_for
from swarmd.averaging.state import BlockState
from swarmd.core.data import ByteData
from swarmd.core.schedule import allocate, first_round, training_blocks
from swarmd.core.train import BlockTrainer, seed_for
from swarmd.protocol import PayloadKind
from swarmd.sim.costs import StepCosts
from swarmd.sim.engine import RoundRecord, SimConfig, Simulator
from swarmd.sim.policies import Policy
from swarmd.sim.regimes import Regime, RoundDraw
from swarmd.sim.workers import Worker


@dataclass(frozen=True)
class SchedulePlan:
    """A schedule (swarmd.core.schedule.SCHEDULES) over `peers` peers; `turn`: its turn or growth rounds."""

    schedule: str
    peers: int
    turn: int
    pinned: bool = False
    # grow, concurrent: a block takes up to this x H steps, as many as the slowest block's H take (balanced_rounds)
    balance_steps: float = 1.0

    def staffing(self, round_no: int, blocks: int) -> list[int]:
        return allocate(self.peers, training_blocks(self.schedule, round_no, blocks, self.turn), blocks, self.pinned)

    def life(self, block: int, blocks: int, rounds: int) -> tuple[int, int]:
        """The first and last round `block` trains in a run of `rounds` rounds: its learning-rate schedule (warmup,
        then the cosine to its floor) spans exactly these rounds, so every block ends fully decayed."""
        first = first_round(self.schedule, block, blocks, self.turn)
        return first, min(rounds, first + self.turn - 1) if self.schedule == "sequential" else rounds


@dataclass
class ScheduleRecord:
    round: int
    staffing: list[int]  # peers per block this round
    busy_share: float  # peer-seconds spent on training steps / (peers x round seconds)
    trained_s: float  # those peer-seconds
    pull_bytes: int  # predecessor pulls (their real wire bytes: SimConfig.pull_codec) and joiners' downloads
    pull_raw_bytes: int = 0  # the same at fp32


class ScheduledSimulator(Simulator):
    """SchedulePlan's peers on `data` under a regime and policy, priced by `costs` (see the module doc)."""

    def __init__(
        self,
        cfg: SimConfig,
        regime: Regime,
        policy: Policy,
        data: ByteData,
        eval_xy: tuple[torch.Tensor, torch.Tensor],
        plan: SchedulePlan,
        costs: StepCosts,
        gossip: GossipConfig | None = None,
    ):
        if cfg.overlap:
            raise ValueError("a scheduled simulation runs without overlap")
        if costs.blocks != cfg.model.blocks:
            raise ValueError(f"costs for {costs.blocks} blocks, model of {cfg.model.blocks}")
        super().__init__(replace(cfg, workers=1), regime, policy, data, eval_xy, gossip=gossip)
        self.plan, self.costs, self.data = plan, costs, data
        self.keepers = {w.block: w for w in self.workers}
        self.opened: set[int] = set()
        self.arrived: set[str] = set()  # workers that came to their block this round (they download it)
        self.slots = 0
        self.table = {k: v.clone() for k, v in self.keepers[0].state.base_emb.items()}
        self.records: list[ScheduleRecord] = []
        self._compute: dict[str, float] = {}  # this round's priced training seconds per worker
        self._pulls: list[int] = []
        self._downloads = 0  # this round's joiners' downloads (fp32: adopted state)
        self._pull_ratio = 1.0  # wire over fp32 bytes of the last round's predecessor pulls (prices this round's)
        H, cap = cfg.steps_per_round, plan.balance_steps if plan.schedule != "sequential" else 1.0  # a turn: one block
        self.block_steps = costs.balanced_steps(H, cap)

    def steps_of(self, w: Worker) -> int:
        return self.block_steps[w.block]

    # -- staffing -------------------------------------------------------------------------------------
    def heads(self) -> list[Worker]:
        """Every block's keeper (a staffed block's keeper is its first worker: it trains and merges)."""
        return [self.keepers[b] for b in range(self.cfg.model.blocks)]

    def _new_worker(self, block: int) -> Worker:
        m, t = self.cfg.model, self.cfg.train
        self.slots += 1
        state = BlockState(BlockTrainer(m, t, block, "cpu", worker_seed=self.slots), outer_for(self.gossip))
        return Worker(
            f"b{block}s{self.slots}",
            block,
            state,
            self.data.stream(seed_for("data", t.seed, block, "slot", self.slots), t.batch_size),
            {PayloadKind.BLOCK_DELTA: ErrorFeedback(), PayloadKind.EMBEDDING_DELTA: ErrorFeedback()},
        )

    def _open(self, block: int) -> None:
        """A block's first round: its keeper warm-starts from the predecessor's merged state (block_init)."""
        self.opened.add(block)
        keeper = self.keepers[block]
        if block > 0 and self.cfg.train.block_init == "predecessor":
            keeper.state.use_predecessors(self._handoff(keeper, {block - 1: self.keepers[block - 1].state.base_block}))
            keeper.state.warm_start()

    def _staff(self, staffing: list[int]) -> None:
        """This round's workers: per block its keeper and staffing - 1 more; newcomers adopt the merged state."""
        current: dict[int, list[Worker]] = {}
        for w in self.workers:
            current.setdefault(w.block, []).append(w)
        workers, self.arrived = [], set()
        for b, n in enumerate(staffing):
            if n <= 0:
                continue
            if b not in self.opened:
                self._open(b)
            keeper = self.keepers[b]
            mine = [w for w in current.get(b, []) if w is not keeper][: n - 1]
            while len(mine) < n - 1:
                mine.append(self._new_worker(b))
            for w in [keeper, *mine]:
                if w not in current.get(b, []):
                    if self.round:  # at round 1 every peer builds the seeded initial state itself
                        self.arrived.add(w.id)
                    w.state.adopt(keeper.state.base_block if w is not keeper else None, self.table)
                    w.anchors[PayloadKind.BLOCK_DELTA].clear()
                    w.anchors[PayloadKind.EMBEDDING_DELTA].clear()
            workers.extend([keeper, *mine])
        self.workers = workers

    def _schedule_lr(self, round_no: int) -> None:
        """Each worker's place in its block's learning-rate schedule (TrainConfig.total_steps > 0): the steps since
        the block's first round, over a cosine as long as the block's life (SchedulePlan.life); a peer that comes
        to a block takes up the block's place in it."""
        t = self.cfg.train
        if t.total_steps <= 0:
            return
        for w in self.workers:
            H = self.block_steps[w.block]
            first, last = self.plan.life(w.block, self.cfg.model.blocks, self.cfg.rounds)
            w.state.train_cfg = replace(t, total_steps=(last - first + 1) * H)
            w.state.trainer.train_cfg = replace(w.state.trainer.train_cfg, total_steps=(last - first + 1) * H)
            w.state.trainer.step_count = (round_no - first) * H

    # -- the clock ------------------------------------------------------------------------------------
    def _draw(self, n: int, steps: int) -> RoundDraw:
        """The engine's draw with each worker's compute priced by its block's step cost, stretched to the time its
        predecessor pulls (and a newcomer's download of its block and table) take on its link, plus the daemon's
        fixed costs of a round (StepCosts.round_s and pull_s; busy_share counts the steps only)."""
        draw = super()._draw(n, steps)
        median = self.regime.compute_s.median or 1.0
        c = self.costs
        self._pulls, self._downloads = [], 0
        for i, w in enumerate(self.workers):
            draw.compute_s[i] *= c.block_s[w.block] / median * self.block_steps[w.block] / steps
            self._compute[w.id] = float(draw.compute_s[i])
            pulls = self.cfg.train.predecessor_pulls * w.block if self.cfg.train.trajectory_prob else 0
            pulled = int(pulls * c.block_bytes * self._pull_ratio)
            if w.id in self.arrived:
                pulled += c.block_bytes + c.table_bytes
                self._downloads += c.block_bytes + c.table_bytes
            self._pulls.append(pulled)
            fixed = c.round_s + pulls * c.pull_s  # a daemon's own work a round besides steps and transfers
            draw.compute_s[i] = max(float(draw.compute_s[i]), pulled / float(draw.bandwidth_Bps[i])) + fixed
        return draw

    # -- one round ------------------------------------------------------------------------------------
    def step(self) -> RoundRecord:
        """Staff the round from the plan, run the engine's round, then keep the merged table."""
        r = self.round + 1
        staffing = self.plan.staffing(r, self.cfg.model.blocks)
        self._staff(staffing)
        if not self.workers:  # nothing trains this round (a sequential run past its last turn)
            self.round += 1
            record = RoundRecord(r, self.clock, 0.0, None, 0, 0, 0, 0, 0, float("nan"), None)
            self.records.append(ScheduleRecord(r, staffing, 0.0, 0.0, 0))
            return record
        self._schedule_lr(r)
        before = {w.id: w.state.trainer.step_count for w in self.workers}
        record = super().step()
        busy = sum(self._compute[w.id] for w in self.workers if w.state.trainer.step_count > before[w.id])
        self.table = {k: v.clone() for k, v in self.workers[0].state.base_emb.items()}
        for keeper in self.keepers.values():
            if keeper not in self.workers:
                keeper.state.adopt(None, self.table)
        share = min(1.0, busy / max(1e-12, self.plan.peers * record.seconds))
        self.records.append(ScheduleRecord(r, staffing, share, busy, *self._pull_totals()))
        return record

    def _pull_totals(self) -> tuple[int, int]:
        """This round's (wire, fp32) bytes of predecessor pulls and downloads; fp32 pulls as priced on the clock
        (TrainConfig.predecessor_pulls per predecessor), lossy ones as the engine encoded them."""
        if self.cfg.pull_codec == "fp32":
            return int(sum(self._pulls)), int(sum(self._pulls))
        wire, raw = (sum(v) for v in zip(*self.pulled.values())) if self.pulled else (0, 0)
        if raw:
            self._pull_ratio = wire / raw
        return int(wire + self._downloads), int(raw + self._downloads)
