"""Group averaging in the simulator: each round's groups, each group's merge landed on its members, consensus.

Owns plan() (the round's groups of each part with the daemon's round_members / assign, salted per part: a
block's replicas, every worker for the byte table; an anchor taken when a part first averages in groups),
merge_groups() (each group merges its accepted payloads with the daemon's merge; an anchored member's step
reaches anchor + merged offsets, and a part averaged as one group lands those bits exactly and re-anchors:
swarmd.averaging.merge.apply_merged's rule) and consensus() (the largest relative distance between two same-part
bases). Workers are the simulator's: an id, a block, a BlockState and an Anchor per part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.groups import Anchor, assign, base_step, merged_target, round_members
from swarmd.averaging.state import BlockState, relative_distance
from swarmd.protocol import PayloadKind

Tensors = dict[str, torch.Tensor]
Groups = dict[PayloadKind, tuple[list[list[int]], bool]]  # part -> (groups of worker indices, grouped this round)
BLOCK, EMB = PayloadKind.BLOCK_DELTA, PayloadKind.EMBEDDING_DELTA


class Worker(Protocol):
    id: str
    block: int
    state: BlockState
    anchors: dict[PayloadKind, Anchor]


def _base(w: Worker, kind: PayloadKind) -> tuple[Tensors, str]:
    return (w.state.base_block, w.state.block_hash) if kind.is_block else (w.state.base_emb, w.state.emb_hash)


def plan(workers: Sequence[Worker], blocks: int, round: int, gossip: GossipConfig) -> Groups:
    """This round's groups of each part; sets the anchor of every worker of a part that averages in groups."""
    index = {w.id: i for i, w in enumerate(workers)}
    parts = [(BLOCK, f"block{b}", [w.id for w in workers if w.block == b]) for b in range(blocks)]
    parts.append((EMB, "table", [w.id for w in workers]))
    out: Groups = {}
    for kind, salt, ids in parts:
        if not ids:  # a block no worker holds this round (a schedule's closed or finished block)
            continue
        table = not kind.is_block
        grouped = round_members(ids[0], ids, round, gossip, salt, table=table) is not None
        k = gossip.table_group_size if table else gossip.group_size
        found = [
            [index[i] for i in g]
            for g in (assign(ids, round, k, salt, gossip.group_layout) if grouped else [sorted(ids)])
        ]
        out.setdefault(kind, ([], grouped))[0].extend(found)
        for w in (workers[index[x]] for x in ids):
            if grouped and not w.anchors[kind].active:
                w.anchors[kind].set(*_base(w, kind), round)
    return out


def group_of(groups: Groups, kind: PayloadKind, i: int) -> list[int]:
    """The members (worker indices) of worker i's group for this part."""
    return next(g for g in groups[kind][0] if i in g)


def merge_groups(
    workers: Sequence[Worker],
    groups: Groups,
    accepted: set[int],
    outputs: dict[int, tuple[Tensors, Tensors]],
    merge: Callable[[dict[str, Tensors]], Tensors],
) -> tuple[list[dict[PayloadKind, Tensors | None]], list[dict[PayloadKind, Tensors]]]:
    """Per worker, the step of each part its group's merge gives (None: keep the base), and the exact bits a
    part averaged as one group lands (the new anchor). Sets each block replica's ReplicaAdamW K."""
    steps: list[dict[PayloadKind, Tensors | None]] = [{} for _ in workers]
    exact: list[dict[PayloadKind, Tensors]] = [{} for _ in workers]
    for kind, (found, grouped) in groups.items():
        slot = 0 if kind.is_block else 1
        for g in found:
            payloads = {workers[i].id: outputs[i][slot] for i in g if i in accepted}
            value = merge(payloads) if payloads else None
            for i in g:
                w, anchor = workers[i], workers[i].anchors[kind]
                if kind.is_block:  # the K of TrainConfig.replica_adam: the block deltas this merge counts
                    w.state.set_replicas(len(payloads))
                if value is None or not anchor.active or anchor.tensors is None:
                    steps[i][kind] = value
                    continue
                target = merged_target(anchor.tensors, value)
                steps[i][kind] = base_step(target, _base(w, kind)[0])
                if not grouped:  # every member merged the same offsets: same bits, the new anchor
                    exact[i][kind] = target
    return steps, exact


def consensus(workers: Sequence[Worker], blocks: int) -> float:
    """The largest relative distance between two replicas' bases of a block, or two workers' tables (0 when
    every part is bit-identical across its replicas, as after any all-to-all round)."""
    worst = 0.0
    for b in range(blocks):
        bases = [w.state.base_block for w in workers if w.block == b]
        worst = max([worst, *(relative_distance(bases[0], x) for x in bases[1:])])
    tables = [w.state.base_emb for w in workers]
    return max([worst, *(relative_distance(tables[0], x) for x in tables[1:])])
