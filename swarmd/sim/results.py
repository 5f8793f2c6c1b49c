"""What a simulated run records: RoundRecord (one round's clock, arrivals, bytes and CE) and SimResult (a run's
rounds and the figures read off them: final CE, participation, simulated wall time, wire bytes, the CE curve).
Plain dataclasses: swarmd.sim.engine fills them, the benchmarks and `blocktrain simulate` read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RoundRecord:
    round: int  # 1-based
    t_s: float  # simulated clock at the end of the round, seconds
    seconds: float  # simulated length of the round
    deadline_s: float | None  # the policy's deadline after round start (None = lockstep)
    workers: int  # all virtual workers
    dropped: int
    late: int  # non-dropped workers whose update missed the deadline
    accepted: int
    upload_bytes: int  # real wire bytes uploaded this round (every copy of every delta sent)
    train_ce: float  # mean training CE of the workers that trained (NaN if none did)
    ce: float | None  # from-noise CE of the merged stack after the round (None = not measured)
    consensus: float | None = None  # Simulator.consensus() after the round, when ce was measured

    @property
    def participation(self) -> float:
        return self.accepted / self.workers


@dataclass
class SimResult:
    regime: str
    policy: str
    seed: int
    ce_start: float
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def ce(self) -> float:
        measured = [r.ce for r in self.rounds if r.ce is not None]
        return measured[-1] if measured else self.ce_start

    @property
    def participation(self) -> float:
        """Accepted updates / all worker-rounds (dropped workers count as not participating)."""
        return sum(r.accepted for r in self.rounds) / max(1, sum(r.workers for r in self.rounds))

    @property
    def sim_wall_s(self) -> float:
        return self.rounds[-1].t_s if self.rounds else 0.0

    @property
    def wire_bytes(self) -> int:
        return sum(r.upload_bytes for r in self.rounds)

    def curve(self) -> list[tuple[float, float]]:
        """(simulated seconds, from-noise CE), starting at (0, ce_start)."""
        return [(0.0, self.ce_start), *((r.t_s, r.ce) for r in self.rounds if r.ce is not None)]

    def summary(self) -> dict:
        return {
            "regime": self.regime,
            "policy": self.policy,
            "seed": self.seed,
            "ce_start": self.ce_start,
            "ce": self.ce,
            "participation": self.participation,
            "sim_wall_s": self.sim_wall_s,
            "wire_bytes": self.wire_bytes,
            "rounds": len(self.rounds),
        }

    def to_dict(self) -> dict:
        return {**self.summary(), "history": [{**asdict(r), "participation": r.participation} for r in self.rounds]}
