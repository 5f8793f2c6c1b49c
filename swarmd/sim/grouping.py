"""Group averaging in the simulator: each round's groups, each group's merge landed on its members, consensus.

Owns plan() (the round's groups of each part with the daemon's round_members / assign, salted per part: a
block's replicas, every worker for the byte table; an anchor taken when a part first averages in groups),
merge_groups() (each group merges its accepted payloads with the daemon's merge; an anchored member's step
reaches anchor + merged offsets, and a part averaged as one group lands those bits exactly and re-anchors:
swarmd.averaging.merge.apply_merged's rule) and consensus() (the largest relative distance between two same-part
bases). Under the "two-phase" layout (swarmd.averaging.phases) plan_phases() lays each grouped part's rows, and
merge_groups() adds phase 2: each worker takes every other row's merged value from that row's source member (through
the codec: relay_fn, the same decoded bits for every reader, its own row's included) and lands their count-weighted
mean (each row's value clipped as the daemon does: phases.combine_clipped); a source that was not accepted (dropped
or late) is replaced by the next accepted member of its row (phases.fallbacks); a part whose workers all combined
the same rows lands those bits exactly and re-anchors, else the anchor stays. Workers are the simulator's: an id, a
block, a BlockState and an Anchor per part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from swarmd.averaging import phases
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delta import decode, encode, shapes_of
from swarmd.averaging.groups import OFFSET_INT8_RMS_LEVELS, Anchor, assign, base_step, merged_target, round_members
from swarmd.averaging.state import BlockState, relative_distance
from swarmd.protocol import Codec, PayloadKind

Tensors = dict[str, torch.Tensor]
Groups = dict[PayloadKind, tuple[list[list[int]], bool]]  # part -> (groups of worker indices, grouped this round)
Layouts = dict[PayloadKind, list[list[list[int]]]]  # two-phase: kind -> each grouped part's rows (worker indices)
Relay = Callable[[PayloadKind, int, Tensors], tuple[Tensors, int]]  # a row value -> (what readers decode, wire bytes)
BLOCK, EMB = PayloadKind.BLOCK_DELTA, PayloadKind.EMBEDDING_DELTA


class Worker(Protocol):
    id: str
    block: int
    state: BlockState
    anchors: dict[PayloadKind, Anchor]


def _base(w: Worker, kind: PayloadKind) -> tuple[Tensors, str]:
    return (w.state.base_block, w.state.block_hash) if kind.is_block else (w.state.base_emb, w.state.emb_hash)


def _parts(workers: Sequence[Worker], blocks: int) -> list[tuple[PayloadKind, str, list[str]]]:
    """(kind, salt, worker ids) of every part: each block's replicas, then every worker for the table."""
    parts = [(BLOCK, f"block{b}", [w.id for w in workers if w.block == b]) for b in range(blocks)]
    parts.append((EMB, "table", [w.id for w in workers]))
    return parts


def plan(workers: Sequence[Worker], blocks: int, round: int, gossip: GossipConfig) -> Groups:
    """This round's groups of each part; sets the anchor of every worker of a part that averages in groups."""
    index = {w.id: i for i, w in enumerate(workers)}
    out: Groups = {}
    for kind, salt, ids in _parts(workers, blocks):
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


def plan_phases(workers: Sequence[Worker], blocks: int, round: int, gossip: GossipConfig) -> Layouts:
    """Layout "two-phase" only: the rows (phases.rows, the daemon's call) of each part that averages in groups."""
    if gossip.group_layout != "two-phase":
        return {}
    index = {w.id: i for i, w in enumerate(workers)}
    out: Layouts = {}
    for kind, salt, ids in _parts(workers, blocks):
        table = not kind.is_block
        if ids and round_members(ids[0], ids, round, gossip, salt, table=table) is not None:
            k = gossip.table_group_size if table else gossip.group_size
            out.setdefault(kind, []).append([[index[p] for p in row] for row in phases.rows(ids, round, k, salt)])
    return out


def relay_fn(codec: Codec | str) -> Relay:
    """Phase 2's wire: a row's merged offsets through the real codec, without error feedback (deterministic, so
    every reader decodes the same bits from whichever member sends them), at the anchored payloads' int8 step."""

    def relay(kind: PayloadKind, block: int, value: Tensors) -> tuple[Tensors, int]:
        meta: dict[str, Any] = dict(swarm_id="sim", config_hash="sim", kind=kind, block_index=block)
        enc = encode(value, codec, int8_rms_levels=OFFSET_INT8_RMS_LEVELS, **meta)
        return decode(enc, shapes_of(value), **meta), enc.wire_bytes

    return relay


def group_of(groups: Groups, kind: PayloadKind, i: int) -> list[int]:
    """The members (worker indices) of worker i's group for this part."""
    return next(g for g in groups[kind][0] if i in g)


def _phase2(
    workers: Sequence[Worker],
    kind: PayloadKind,
    rows: list[list[int]],
    values: dict[int, Tensors | None],
    counts: dict[int, int],
    accepted: set[int],
    relay: Relay,
    relayed: list[int],
) -> bool:
    """Phase 2 of one part (see the module doc): replaces each worker's row value in `values` by the count-weighted
    mean of the rows it got, adds each source's wire bytes to `relayed`; True when every worker combined the same
    rows (the same bits: the part lands them exactly)."""
    ids = [[workers[i].id for i in row] for row in rows]
    index = {w.id: i for i, w in enumerate(workers)}
    block = workers[rows[0][0]].block if kind.is_block else -1
    decoded: dict[int, tuple[Tensors, int]] = {}  # row -> (what its readers decode, wire bytes)
    for r, row in enumerate(rows):
        value = values[row[0]]  # every member of a row holds its merge (a non-accepted one too: the sim lands it)
        if value is not None and counts[row[0]]:
            decoded[r] = relay(kind, block, value)
    used: set[frozenset[int]] = set()
    for r, row in enumerate(rows):
        for i in row:
            got = [r] if r in decoded else []
            for s, asked in phases.fallbacks(ids, workers[i].id).items():
                # a worker whose payload missed the deadline serves no reader: the row's next member does
                source = next((index[p] for p in asked if index[p] in accepted), None)
                if s in decoded and source is not None:
                    got.append(s)
                    relayed[source] += decoded[s][1]
            got.sort()
            used.add(frozenset(got))
            values[i] = phases.combine_clipped([(counts[rows[s][0]], decoded[s][0]) for s in got]) if got else None
    return len(used) == 1 and bool(next(iter(used)))


def merge_groups(
    workers: Sequence[Worker],
    groups: Groups,
    accepted: set[int],
    outputs: dict[int, tuple[Tensors, Tensors]],
    merge: Callable[[dict[str, Tensors]], Tensors],
    layouts: Layouts | None = None,
    relay: Relay | None = None,
) -> tuple[list[dict[PayloadKind, Tensors | None]], list[dict[PayloadKind, Tensors]], list[int]]:
    """Per worker, the step of each part its group's merge gives (None: keep the base), the exact bits a
    part averaged as one group (or, two-phase, combined the same rows everywhere) lands (the new anchor), and the
    phase-2 wire bytes each worker sent (layouts: plan_phases'; relay: relay_fn's). Sets each block replica's
    ReplicaAdamW K."""
    steps: list[dict[PayloadKind, Tensors | None]] = [{} for _ in workers]
    exact: list[dict[PayloadKind, Tensors]] = [{} for _ in workers]
    relayed = [0] * len(workers)
    for kind, (found, grouped) in groups.items():
        slot = 0 if kind.is_block else 1
        values: dict[int, Tensors | None] = {}
        counts: dict[int, int] = {}
        for g in found:
            payloads = {workers[i].id: outputs[i][slot] for i in g if i in accepted}
            value = merge(payloads) if payloads else None
            for i in g:
                values[i], counts[i] = value, len(payloads)
                if kind.is_block:  # the K of TrainConfig.replica_adam: the block deltas this merge counts
                    workers[i].state.set_replicas(len(payloads))
        same = set(values) if not grouped else set()  # every member merged the same offsets: same bits
        for rows in (layouts or {}).get(kind, []):
            if relay is None:
                raise ValueError("a two-phase layout needs a relay (relay_fn)")
            if _phase2(workers, kind, rows, values, counts, accepted, relay, relayed):
                same.update(i for row in rows for i in row)
        for i, value in values.items():
            w, anchor = workers[i], workers[i].anchors[kind]
            if value is None or not anchor.active or anchor.tensors is None:
                steps[i][kind] = value
                continue
            target = merged_target(anchor.tensors, value)
            steps[i][kind] = base_step(target, _base(w, kind)[0])
            if i in same:  # the new anchor
                exact[i][kind] = target
    return steps, exact, relayed


def consensus(workers: Sequence[Worker], blocks: int) -> float:
    """The largest relative distance between two replicas' bases of a block, or two workers' tables (0 when
    every part is bit-identical across its replicas, as after any all-to-all round)."""
    worst = 0.0
    for b in range(blocks):
        bases = [w.state.base_block for w in workers if w.block == b]
        worst = max([worst, *(relative_distance(bases[0], x) for x in bases[1:])])
    tables = [w.state.base_emb for w in workers]
    return max([worst, *(relative_distance(tables[0], x) for x in tables[1:])])
