"""A simulated worker and what it trains with: Worker (one replica's BlockState, batches and error feedback),
PredecessorHandoff (predecessor states as a daemon pulls them: SimConfig.pull_codec, their real wire bytes, and
the chain each worker holds of each predecessor under "int8-chain") and train_in_chunks (a round's steps in
TrainConfig.predecessor_pulls chunks, the mid-round pulls between them). No grpc, no asyncio, no files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from swarmd.averaging.compact import delta_roundtrip, roundtrip
from swarmd.averaging.delta import ErrorFeedback
from swarmd.averaging.groups import Anchor
from swarmd.averaging.pull_chain import chain_pull
from swarmd.averaging.state import BlockState, merge_train_stats
from swarmd.core.config import TrainConfig
from swarmd.core.train import split_steps
from swarmd.protocol import PayloadKind

Tensors = dict[str, torch.Tensor]


@dataclass
class Worker:
    id: str
    block: int
    state: BlockState
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    ef: dict[PayloadKind, ErrorFeedback]
    upload_bytes: int = 0  # last round's upload (estimate for a skipped late worker's arrival)
    exact: tuple[Tensors, Tensors] | None = None  # overlap: own (block, table) deltas of the merge in flight
    anchors: dict[PayloadKind, Anchor] = field(  # group averaging: each part's anchor (swarmd.averaging.groups)
        default_factory=lambda: {PayloadKind.BLOCK_DELTA: Anchor(), PayloadKind.EMBEDDING_DELTA: Anchor()}
    )


class PredecessorHandoff:
    """Predecessor states as the workers pull them, under one pull codec (SimConfig.pull_codec, int8 at
    `int8_levels`); `pulled` holds this round's (wire, raw fp32) bytes per worker id."""

    def __init__(self, codec: str, int8_levels: float | None):
        self.codec, self.int8_levels = codec, int8_levels
        self.pulled: dict[str, tuple[int, int]] = {}
        self.chains: dict[tuple[str, int], tuple[int, Tensors]] = {}  # int8-chain: (worker, block) -> (start, state)

    def new_round(self) -> None:
        self.pulled = {}

    def pull(
        self, worker: str, states: dict[int, Tensors], round: int, held: dict[int, Tensors] | None = None
    ) -> dict[int, Tensors]:
        """What `worker` runs of these predecessor states, their bytes counted: int8-delta mid-round pulls (`held`:
        the round-start states it runs) come as int8 deltas against those, int8-chain round-start ones as steps
        along the worker's chain (swarmd.averaging.pull_chain), the rest through the codec's round trip."""
        out, (wire, raw) = {}, self.pulled.get(worker, (0, 0))
        for b, state in states.items():
            if held is not None and b in held and self.codec == "int8-delta":
                out[b], n = delta_roundtrip(state, held[b], b)
            elif held is None and self.codec == "int8-chain":
                start, chain = self.chains.get((worker, b), (round, None))
                out[b], n, new = chain_pull(state, chain, round, start, b)
                self.chains[(worker, b)] = (round if new else start, out[b])
            else:
                out[b], n = roundtrip(state, self.codec, b, self.int8_levels)
            wire, raw = wire + n, raw + sum(4 * t.numel() for t in state.values())
        self.pulled[worker] = (wire, raw)
        return out


def train_in_chunks(
    trained: list[Worker],
    steps: dict[str, int],
    train: TrainConfig,
    handoff: Callable[[Worker, dict[int, Tensors], dict[int, Tensors] | None], dict[int, Tensors]],
) -> dict[str, float]:
    """steps[id] real steps of each worker (id -> train CE) in TrainConfig.predecessor_pulls chunks, in lockstep:
    between chunks each worker runs its predecessors as the first trained replica of each block holds them then, or
    as it held them halfway through the chunk before (TrainConfig.prefetch_pulls), each pulled through `handoff`."""
    sources: dict[int, Worker] = {}
    for w in trained:
        sources.setdefault(w.block, w)

    def now() -> dict[int, Tensors]:
        return {b: src.state.current()[0] for b, src in sources.items()}

    parts: dict[str, list[dict]] = {w.id: [] for w in trained}
    chunks = {w.id: split_steps(steps[w.id], train.predecessor_pulls) for w in trained}
    count = max((len(c) for c in chunks.values()), default=0)
    ahead = train.prefetch_pulls and any(w.state.predecessors for w in trained)
    pulled: dict[int, Tensors] = {}  # taken halfway through the chunk before (prefetch), else at the chunk's end
    for c in range(count):
        todo = {w.id: chunks[w.id][c] if c < len(chunks[w.id]) else 0 for w in trained}
        if c:
            pulled = pulled or now()
            for w in trained:
                if w.state.predecessors:  # what it runs: a daemon pulls only those
                    fresh = {b: pulled[b] for b in w.state.predecessors if b in pulled}
                    w.state.refresh_predecessors(handoff(w, fresh, w.state.predecessors))
            pulled = {}
        if ahead and c + 1 < count and max(todo.values()) > 1:
            for w in trained:
                parts[w.id].append(w.state.train_steps(todo[w.id] // 2, w.batches))
                todo[w.id] -= todo[w.id] // 2
            pulled = now()
        for w in trained:
            parts[w.id].append(w.state.train_steps(todo[w.id], w.batches))
    return {i: merge_train_stats(p)["ce"] for i, p in parts.items()}
